"""Between the wire's messages and the client's values, for the sync and asyncio clients alike."""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from berth.v1 import exec_pb2 as pe
from berth.v1 import files_pb2 as pf
from berth.v1 import logs_pb2 as pl
from berth.v1 import sandbox_pb2 as pb
from berth.v1 import snapshots_pb2 as ps
from berth.v1 import templates_pb2 as pt
from berth.v1 import volumes_pb2 as pv

from . import _files
from .errors import ExecTimeout
from .types import Change, Chunk, Exec, ExecResult, Failure, Mount, PortUrl, Provider, Sandbox, Snapshot, Template, Volume, _time

PHASES = {
    pb.PHASE_PROVISIONING: "Provisioning",
    pb.PHASE_STARTING: "Starting",
    pb.PHASE_READY: "Ready",
    pb.PHASE_PAUSED: "Paused",
    pb.PHASE_STOPPING: "Stopping",
    pb.PHASE_STOPPED: "Stopped",
    pb.PHASE_DELETING: "Deleting",
    pb.PHASE_ERROR: "Error",
}
INTENTS = {
    pb.INTENT_RUNNING: "Running",
    pb.INTENT_PAUSED: "Paused",
    pb.INTENT_STOPPED: "Stopped",
    pb.INTENT_DELETED: "Deleted",
}
EXEC_STATES = {
    pe.EXEC_STATE_ADMITTED: "Admitted",
    pe.EXEC_STATE_RUNNING: "Running",
    pe.EXEC_STATE_EXITED: "Exited",
    pe.EXEC_STATE_SIGNALLED: "Signalled",
    pe.EXEC_STATE_TIMED_OUT: "TimedOut",
    pe.EXEC_STATE_CANCELLED: "Cancelled",
    pe.EXEC_STATE_LOST: "Lost",
}
STREAMS = {pe.OUTPUT_STREAM_STDOUT: "stdout", pe.OUTPUT_STREAM_STDERR: "stderr", pe.OUTPUT_STREAM_TTY: "tty"}
ON_EXPIRY = {"stop": pb.ON_EXPIRY_STOP, "delete": pb.ON_EXPIRY_DELETE, "pause": pb.ON_EXPIRY_PAUSE}
RESTART = {"never": pb.RESTART_MODE_NEVER, "on-failure": pb.RESTART_MODE_ON_FAILURE, "always": pb.RESTART_MODE_ALWAYS}
#: The RPC of each lifecycle command.
LIFECYCLE_RPCS = {
    "stop": "StopSandbox",
    "start": "StartSandbox",
    "pause": "PauseSandbox",
    "resume": "ResumeSandbox",
    "delete": "DeleteSandbox",
}


def lifecycle_request(verb: str, name: str, expected_version: Optional[int], checkpoint: bool = False):
    """The request of lifecycle command `verb`: a pause's carries whether it checkpoints."""
    if verb == "pause":
        return pb.PauseRequest(name=name, expected_resource_version=expected_version, checkpoint=checkpoint)
    if checkpoint:
        raise ValueError(f"only a pause checkpoints, not a {verb}")
    return pb.LifecycleRequest(name=name, expected_resource_version=expected_version)


#: The phase each lifecycle command waits for; `None`: gone.
TARGETS = {"create": "Ready", "start": "Ready", "stop": "Stopped", "pause": "Paused", "resume": "Ready", "delete": None}
SNAPSHOT_PHASES = {
    ps.SNAPSHOT_PHASE_CREATING: "Creating",
    ps.SNAPSHOT_PHASE_READY: "Ready",
    ps.SNAPSHOT_PHASE_ERROR: "Error",
    ps.SNAPSHOT_PHASE_DELETING: "Deleting",
}
VOLUME_PHASES = {pv.VOLUME_PHASE_READY: "Ready", pv.VOLUME_PHASE_DELETING: "Deleting"}
#: How often a deleted snapshot or volume is read again until it is gone: no watch follows them.
RECORD_POLL = 0.1


def _opt(message, field: str):
    return getattr(message, field) if message.HasField(field) else None


def sandbox(s: pb.Sandbox) -> Sandbox:
    failure = None
    cpu_millis = _opt(s.spec.limits, "cpu_millis")
    if s.phase == pb.PHASE_ERROR and s.HasField("failure"):
        failure = Failure(s.failure.reason, _opt(s.failure, "exit_code"), s.failure.message)
    return Sandbox(
        id=s.id,
        name=s.name,
        phase=PHASES.get(s.phase, "Unknown"),
        intent=INTENTS.get(s.intent, "Unknown"),
        generation=s.generation,
        resource_version=s.resource_version,
        image=s.spec.image,
        command=list(s.spec.command),
        labels=dict(s.spec.labels),
        providers=list(s.providers),
        failure=failure,
        completed=s.completed,
        created_at=_time(s.created_at_unix_ms),
        updated_at=_time(s.updated_at_unix_ms),
        deadline=_time(_opt(s, "deadline_unix_ms")),
        expired_at=_time(_opt(s, "expired_at_unix_ms")),
        idle_expired_at=_time(_opt(s, "idle_expired_at_unix_ms")),
        restart_count=s.restart_count,
        template=s.template or None,
        cpus=None if cpu_millis is None else cpu_millis / 1000,
        memory=_opt(s.spec.limits, "memory_bytes"),
        pids=_opt(s.spec.limits, "pids"),
        allow=list(s.spec.egress.allow),
        egress_providers=list(s.egress_providers),
        from_snapshot=s.from_snapshot or None,
        checkpoint=s.checkpoint,
    )


def snapshot(s: ps.Snapshot) -> Snapshot:
    return Snapshot(
        name=s.name,
        id=s.id,
        source=s.source,
        source_id=s.source_id,
        source_generation=s.source_generation,
        phase=SNAPSHOT_PHASES.get(s.phase, "Unknown"),
        error=s.error or None,
        size_bytes=s.size_bytes,
        sha256=s.sha256,
        image=s.image or None,
        resource_version=s.resource_version,
        created_at=_time(s.created_at_unix_ms),
        updated_at=_time(s.updated_at_unix_ms),
        users=list(s.users),
        fork_of=s.fork_of or None,
    )


def volume(v: pv.Volume) -> Volume:
    return Volume(
        name=v.name,
        id=v.id,
        phase=VOLUME_PHASES.get(v.phase, "Unknown"),
        resource_version=v.resource_version,
        created_at=_time(v.created_at_unix_ms),
        updated_at=_time(v.updated_at_unix_ms),
        users=list(v.users),
    )


def port_url(u: pb.PortUrl) -> PortUrl:
    return PortUrl(url=u.url, token=u.token, generation=u.generation, public=u.public, sandbox_id=u.sandbox_id)


def provider(p: pb.Provider) -> Provider:
    return Provider(p.name, p.kind, list(p.credential_names), p.resource_version, list(p.endpoints))


def exec_record(e: pe.Exec) -> Exec:
    return Exec(
        id=e.id,
        sandbox=e.sandbox,
        argv=list(e.argv),
        state=EXEC_STATES.get(e.state, "Unspecified"),
        exit_code=_opt(e, "exit_code"),
        signal=_opt(e, "signal"),
        message=e.message,
        generation=e.generation,
        output_bytes=_opt(e, "output_bytes"),
    )


def _millis(seconds: Optional[float]) -> Optional[int]:
    if seconds is None:
        return None
    return int(round(seconds * 1000))


def create_request(
    name: str,
    command: Sequence[str],
    *,
    image: str = "",
    env: Optional[Mapping[str, str]] = None,
    labels: Optional[Mapping[str, str]] = None,
    providers: Optional[Iterable[str]] = None,
    ttl: Optional[float] = None,
    idle_timeout: Optional[float] = None,
    on_expiry: Optional[str] = None,
    restart: Optional[str] = None,
    max_restarts: Optional[int] = None,
    cpus: Optional[float] = None,
    memory: Optional[int] = None,
    pids: Optional[int] = None,
    allow: Optional[Iterable[str]] = None,
    on_idle: Optional[str] = None,
    volumes: Optional[Iterable[Mount]] = None,
    public_ports: Optional[Iterable[int]] = None,
) -> pb.CreateSandboxRequest:
    for field, action in (("on_expiry", on_expiry), ("on_idle", on_idle)):
        if action is not None and action not in ON_EXPIRY:
            raise ValueError(f"{field}: expected one of {sorted(ON_EXPIRY)}, got {action!r}")
    if restart is not None and restart not in RESTART:
        raise ValueError(f"restart: expected one of {sorted(RESTART)}, got {restart!r}")
    spec = pb.SandboxSpec(image=image, command=list(command), env=dict(env or {}), labels=dict(labels or {}))
    if ttl is not None or idle_timeout is not None or on_expiry is not None or on_idle is not None:
        spec.lifetime.CopyFrom(
            pb.Lifetime(
                ttl_ms=_millis(ttl),
                idle_timeout_ms=_millis(idle_timeout),
                on_expiry=ON_EXPIRY.get(on_expiry or "stop"),
                on_idle=None if on_idle is None else ON_EXPIRY[on_idle],
            )
        )
    if restart is not None:
        spec.restart.CopyFrom(pb.RestartPolicy(mode=RESTART[restart], max_restarts=max_restarts))
    if cpus is not None or memory is not None or pids is not None:
        # The gateway judges the values (and names the field it refuses); here only what the
        # wire cannot carry is.
        spec.limits.CopyFrom(
            pb.ResourceLimits(cpu_millis=None if cpus is None else int(round(cpus * 1000)), memory_bytes=memory, pids=pids)
        )
    if allow:
        spec.egress.CopyFrom(pb.EgressPolicy(allow=list(allow)))
    spec.volumes.extend(pb.VolumeMount(volume=m.volume, path=m.path, read_only=m.read_only) for m in volumes or [])
    spec.ports.extend(pb.PortSpec(port=port, public=True) for port in public_ports or [])
    return pb.CreateSandboxRequest(name=name, spec=spec, providers=list(providers or []))


def template(t: pt.Template) -> Template:
    return Template(
        name=t.name,
        image=t.spec.image,
        command=list(t.spec.command),
        labels=dict(t.spec.labels),
        min_ready=t.pool.min_ready,
        ready=t.pool.ready,
        members=list(t.pool.member_names),
        resource_version=t.resource_version,
    )


def renew_request(
    name: str, ttl: Optional[float], deadline: Optional[float], expected_version: Optional[int]
) -> pb.RenewSandboxRequest:
    """`deadline`: Unix seconds. The gateway refuses both at once, naming the fields."""
    return pb.RenewSandboxRequest(
        name=name,
        ttl_ms=_millis(ttl),
        deadline_unix_ms=None if deadline is None else int(round(deadline * 1000)),
        expected_resource_version=expected_version,
    )


def claim_request(
    template: str, labels: Optional[Mapping[str, str]], providers: Optional[Iterable[str]], wait: Optional[float]
) -> pt.ClaimSandboxRequest:
    return pt.ClaimSandboxRequest(
        template=template, labels=dict(labels or {}), providers=list(providers or []), wait_ms=_millis(wait)
    )


def logs_request(sandbox: str, generation: int, offset: int, follow: bool) -> pl.ReadLogsRequest:
    return pl.ReadLogsRequest(sandbox=sandbox, generation=generation, offset=offset, follow=follow)


def log_chunk(message: pl.LogsOutput, at: int) -> Tuple[Optional[Chunk], int]:
    """The output a logs message carries from offset `at` on (a chunk may begin before the
    offset a read asked for), if any, and the offset read up to after it."""
    kind = message.WhichOneof("output")
    if kind == "gap":
        return None, max(at, message.gap.to)
    if kind != "chunk":
        return None, at
    c = message.chunk
    skip = max(0, at - c.offset)
    if skip >= len(c.data):
        return None, at
    return Chunk(STREAMS.get(c.stream, "stdout"), c.offset + skip, bytes(c.data[skip:])), c.offset + len(c.data)


def from_snapshot_request(
    name: str, snapshot: str, *, labels: Optional[Mapping[str, str]], providers: Optional[Iterable[str]]
) -> pb.CreateSandboxRequest:
    """A create from `snapshot`: the gateway takes its spec, image and files from the snapshot,
    so the spec carries only the labels added to the snapshot's."""
    spec = pb.SandboxSpec(labels=dict(labels or {}))
    return pb.CreateSandboxRequest(name=name, spec=spec, providers=list(providers or []), from_snapshot=snapshot)


def fork_request(
    name: str, count: int, *, names: Optional[Sequence[str]], labels: Optional[Mapping[str, str]]
) -> ps.ForkSandboxRequest:
    # The gateway judges the count and the names (and names the field it refuses).
    return ps.ForkSandboxRequest(name=name, count=count, names=list(names or []), labels=dict(labels or {}))


def exec_start(
    sandbox: str,
    argv: Sequence[str],
    *,
    exec_id: str,
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    timeout: Optional[float],
    stdin: bool,
) -> pe.ExecInput:
    start = pe.ExecStart(
        sandbox=sandbox,
        argv=list(argv),
        env=dict(env or {}),
        cwd=cwd or "",
        stdin=stdin,
        exec_id=exec_id,
        timeout_ms=_millis(timeout),
    )
    return pe.ExecInput(start=start)


def stdin_messages(data: Optional[bytes], chunk_size: int = 64 * 1024) -> List[pe.ExecInput]:
    """The messages that send `data` as the exec's stdin, then close it."""
    if data is None:
        return []
    out = [pe.ExecInput(stdin=data[i : i + chunk_size]) for i in range(0, len(data), chunk_size)]
    out.append(pe.ExecInput(close_stdin=pe.CloseStdin()))
    return out


class Collector:
    """Gathers an exec's output as it streams: each byte once, at its offset, whatever number of
    streams (a retry, an attach from an offset) delivered it."""

    def __init__(self) -> None:
        self.offset = 0
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.gaps: List[tuple] = []
        self.end: Optional[Exec] = None
        #: The gateway said it admitted the exec: a stream opened again attaches to it.
        self.admitted = False

    def take(self, message: pe.ExecOutput) -> Optional[Chunk]:
        """Takes one message; the new part of a chunk, if it carried one."""
        kind = message.WhichOneof("output")
        if kind == "admitted":
            self.admitted = True
        elif kind == "chunk":
            c = message.chunk
            skip = max(0, self.offset - c.offset)
            if skip >= len(c.data):
                return None
            data = c.data[skip:]
            stream = STREAMS.get(c.stream, "stdout")
            (self.stderr if stream == "stderr" else self.stdout).extend(data)
            self.offset = c.offset + len(c.data)
            return Chunk(stream, c.offset + skip, data)
        if kind == "gap":
            if message.gap.to > self.offset:
                self.gaps.append((max(self.offset, getattr(message.gap, "from")), message.gap.to))
                self.offset = message.gap.to
        elif kind == "end":
            self.end = exec_record(message.end)
        return None


def change(e: pb.SandboxEvent) -> Change:
    return Change(
        name=e.name,
        sandbox=sandbox(e.sandbox) if e.HasField("sandbox") else None,
        removed=e.removed,
        cursor=e.cursor,
    )


def selector(labels: Optional[Mapping[str, str]]) -> Dict[str, str]:
    return dict(labels or {})


def finished(collector: "Collector", sandbox: str, timeout: Optional[float]) -> ExecResult:
    """An exec's result once its stream ended; one that ran past its `timeout` raises
    `ExecTimeout` carrying it, as `subprocess.run` raises `TimeoutExpired`."""
    assert collector.end is not None, "the stream ended with the exec's end"
    result = ExecResult(collector.end, bytes(collector.stdout), bytes(collector.stderr), collector.gaps)
    if result.state == "TimedOut":
        raise ExecTimeout(sandbox, timeout or 0.0, result)
    return result


def upload_inputs(sandbox: str, directory: str, archive: bytes) -> Iterator[pf.UploadInput]:
    yield pf.UploadInput(start=pf.UploadStart(sandbox=sandbox, path=directory))
    for part in _files.chunks(archive):
        yield pf.UploadInput(data=part)


def download_data(message: pf.DownloadOutput) -> bytes:
    return bytes(message.data) if message.WhichOneof("output") == "data" else b""


def page(request_type):
    """A list call's page request, from its page token: the largest page the gateway gives."""
    return lambda token: request_type(page_size=500, page_token=token)
