"""The Python client of a Berth gateway.

    import berth

    with berth.Client() as client:               # the address and token as the CLI finds them
        box = client.create("demo", ["sleep", "infinity"])
        result = client.exec("demo", ["sh", "-c", "echo hi; exit 3"])
        assert (result.stdout, result.exit_code) == (b"hi\\n", 3)
        client.delete("demo")

Snapshots copy a sandbox's files (`create_snapshot`); `create_from_snapshot` makes a sandbox
over such a copy, and `fork` makes several from one point of a running sandbox. Volumes
(`create_volume`, `create(..., volumes=[Mount(...)])`) keep files beyond their sandboxes;
`port_url` gives a URL of the gateway's preview proxy that reaches a port of a sandbox's run.

`berth.aio.AsyncClient` is the same API for asyncio. Every refused call raises a `BerthError`
whose subclass says the gRPC status (`NotFound`, `InvalidArgument`, ...).
"""

from .client import Client
from .errors import (
    Aborted,
    AlreadyExists,
    BerthError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SandboxFailed,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from .types import Change, Chunk, Exec, ExecResult, Failure, Listing, Mount, PortUrl, Provider, Sandbox, Snapshot, Volume

__all__ = [
    "Aborted",
    "AlreadyExists",
    "BerthError",
    "Change",
    "Chunk",
    "Client",
    "DeadlineExceeded",
    "Exec",
    "ExecResult",
    "FailedPrecondition",
    "Failure",
    "InvalidArgument",
    "Listing",
    "Mount",
    "NotFound",
    "PortUrl",
    "Provider",
    "Sandbox",
    "SandboxFailed",
    "Snapshot",
    "Unauthenticated",
    "Unavailable",
    "Volume",
    "WaitTimeout",
]
