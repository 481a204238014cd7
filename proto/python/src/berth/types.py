"""What the client returns: plain, typed values made from the wire's messages."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Dict, List, Optional


def _time(unix_ms: Optional[int]) -> Optional[dt.datetime]:
    if unix_ms is None:
        return None
    return dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.timezone.utc)


@dataclass(frozen=True)
class Failure:
    """Why a sandbox is in Error."""

    reason: str
    exit_code: Optional[int]
    message: str


@dataclass(frozen=True)
class Sandbox:
    """A sandbox as the gateway holds it. `phase` and `intent` are names: "Ready", "Running"."""

    id: str
    name: str
    phase: str
    intent: str
    generation: int
    resource_version: int
    image: str
    command: List[str]
    labels: Dict[str, str]
    providers: List[str]
    failure: Optional[Failure]
    completed: bool
    created_at: Optional[dt.datetime]
    updated_at: Optional[dt.datetime]
    deadline: Optional[dt.datetime] = None
    expired_at: Optional[dt.datetime] = None
    idle_expired_at: Optional[dt.datetime] = None
    restart_count: int = 0
    template: Optional[str] = None
    #: Its limits: CPU cores (fractional), memory in bytes, processes; `None` for no limit.
    cpus: Optional[float] = None
    memory: Optional[int] = None
    pids: Optional[int] = None
    #: Where its runs may connect (host names, `*.suffixes`, CIDR blocks); empty: nowhere.
    allow: List[str] = field(default_factory=list)
    #: The attached providers whose endpoints the current run may reach; one attached since
    #: opens at the next start.
    egress_providers: List[str] = field(default_factory=list)
    #: The snapshot it was made from (its files were that snapshot's), if it was.
    from_snapshot: Optional[str] = None
    #: Paused to a checkpoint on disk (not the freezer): a resume restores it.
    checkpoint: bool = False


@dataclass(frozen=True)
class Listing:
    """Every sandbox a selector picks, and the cursor a fleet watch picks up from: it brings
    exactly the changes after what the listing shows."""

    sandboxes: List[Sandbox]
    cursor: str


@dataclass(frozen=True)
class Change:
    """One event of the fleet watch: a sandbox as it is after a change, its removal, or a
    bookmark (no `name`) that only moves the cursor on. Resume a watch from the last `cursor`."""

    name: str
    sandbox: Optional[Sandbox]
    removed: bool
    cursor: str

    @property
    def is_bookmark(self) -> bool:
        return not self.name


@dataclass(frozen=True)
class Provider:
    """A provider: its credentials' names, never their values."""

    name: str
    kind: str
    credential_names: List[str]
    resource_version: int
    #: Where its credentials are for: attaching it lets a sandbox's runs reach these.
    endpoints: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    """A copy of a sandbox's files, which sandboxes are made from. `phase` is a name: "Creating",
    "Ready", "Error" (`error` says why the copy failed) or "Deleting"."""

    name: str
    id: str
    #: The sandbox it was taken of, its id, and the generation whose files were copied.
    source: str
    source_id: str
    source_generation: int
    phase: str
    error: Optional[str]
    #: The workspace copy's size and SHA-256 (hex), once Ready: every sandbox made from it
    #: starts with these files.
    size_bytes: int
    sha256: str
    #: The image committed of the source's container (Docker, Podman); `None` on the process driver.
    image: Optional[str]
    resource_version: int
    created_at: Optional[dt.datetime]
    updated_at: Optional[dt.datetime]
    #: The sandboxes made from it, in any phase: while one has not had its files yet, the
    #: snapshot cannot be deleted.
    users: List[str] = field(default_factory=list)
    #: The sandbox forked, on the snapshot a fork took (it goes once no fork needs it).
    fork_of: Optional[str] = None


@dataclass(frozen=True)
class Mount:
    """A volume a sandbox's runs see at `path` (on the process driver, the link
    `$BERTH_MOUNTS<path>`, where `read_only` is not enforced)."""

    volume: str
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class Volume:
    """Files with a lifecycle of their own, mounted into sandboxes. `phase` is "Ready" or
    "Deleting"."""

    name: str
    id: str
    phase: str
    resource_version: int
    created_at: Optional[dt.datetime]
    updated_at: Optional[dt.datetime]
    #: The sandboxes that mount it, in any phase.
    users: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class PortUrl:
    """A URL of the gateway's preview proxy reaching a port of a sandbox's current run."""

    url: str
    #: The access token alone (for the `x-berth-port-token` header); empty for a public port.
    #: It is the run's: after a stop and start it gets 410 Gone.
    token: str
    generation: int
    public: bool
    sandbox_id: str


@dataclass(frozen=True)
class Exec:
    """An exec's record. `state` is a name: "Running", "Exited", "TimedOut", "Lost"..."""

    id: str
    sandbox: str
    argv: List[str]
    state: str
    exit_code: Optional[int]
    signal: Optional[int]
    message: str
    generation: int
    output_bytes: Optional[int]

    @property
    def ended(self) -> bool:
        return self.state not in ("Admitted", "Running", "Unspecified")


@dataclass(frozen=True)
class Chunk:
    """Output of an exec, at its offset in the exec's output (stdout and stderr together)."""

    stream: str
    offset: int
    data: bytes


@dataclass
class ExecResult:
    """A finished exec: what it wrote, and how it ended."""

    exec: Exec
    stdout: bytes = b""
    stderr: bytes = b""
    #: Ranges of output no longer kept by the gateway (over the exec's cap), as (from, to).
    gaps: List[tuple] = field(default_factory=list)

    @property
    def exit_code(self) -> Optional[int]:
        return self.exec.exit_code

    @property
    def state(self) -> str:
        return self.exec.state


@dataclass(frozen=True)
class Template:
    """A named spec and its warm pool: `min_ready` kept Ready, `ready` of them now, and the
    names of the members not yet claimed."""

    name: str
    image: str
    command: List[str]
    labels: Dict[str, str]
    min_ready: int
    ready: int
    members: List[str]
    resource_version: int
