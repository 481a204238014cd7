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

Files go in and out of a sandbox's workspace with `write_file`/`read_file` (one file) and
`upload`/`download` (a local file or directory); `logs` reads what the main process wrote;
templates keep warm pools (`create_template`, `set_pool`) that `claim` takes from; `renew` moves
a deadline. An exec given a `timeout` that it runs past raises `ExecTimeout` with its output.

`berth.aio.AsyncClient` is the same API for asyncio. Every refused call raises a `BerthError`
whose subclass says the gRPC status (`NotFound`, `InvalidArgument`, ...).
"""

from .client import Client
from .errors import (
    Aborted,
    AlreadyExists,
    BerthError,
    DeadlineExceeded,
    ExecTimeout,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SandboxFailed,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from .types import (
    Change,
    Chunk,
    Exec,
    ExecResult,
    Failure,
    Listing,
    Mount,
    PortUrl,
    Provider,
    Sandbox,
    Snapshot,
    Template,
    Volume,
)

__all__ = [
    "Aborted",
    "AlreadyExists",
    "BerthError",
    "Change",
    "Chunk",
    "Client",
    "DeadlineExceeded",
    "ExecTimeout",
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
    "Template",
    "Unauthenticated",
    "Unavailable",
    "Volume",
    "WaitTimeout",
]
