"""The synchronous client."""

from __future__ import annotations

import os
import time
import uuid
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

import grpc

from berth.v1 import exec_pb2 as pe
from berth.v1 import exec_pb2_grpc
from berth.v1 import files_pb2 as pf
from berth.v1 import files_pb2_grpc
from berth.v1 import gateway_pb2, gateway_pb2_grpc
from berth.v1 import logs_pb2_grpc
from berth.v1 import sandbox_pb2 as pb
from berth.v1 import sandbox_pb2_grpc
from berth.v1 import snapshots_pb2 as ps
from berth.v1 import snapshots_pb2_grpc
from berth.v1 import templates_pb2 as pt
from berth.v1 import templates_pb2_grpc
from berth.v1 import volumes_pb2 as pv
from berth.v1 import volumes_pb2_grpc

from . import _connect, _files, _wire
from .errors import BerthError, NotFound, SandboxFailed, Unavailable, WaitTimeout, from_rpc
from .types import (
    Change,
    Chunk,
    Exec,
    ExecResult,
    Listing,
    Mount,
    PortUrl,
    Provider,
    Sandbox,
    Snapshot,
    Template,
    Volume,
)

#: How many times an exec's stream is opened again after the gateway went away mid-stream.
EXEC_RETRIES = 5


def _first_then_rest(stream):
    """The stream's messages, the first read already (so that a refusal is raised here)."""
    try:
        first = next(stream)
    except StopIteration:
        return iter(())

    def rest():
        yield first
        yield from stream

    return rest()


class Client:
    """A connection to one Berth gateway. Use it as a context manager, or `close()` it.

    The address and token come from the arguments, else `BERTH_GATEWAY` / `BERTH_TOKEN`, else
    the gateway's data directory (`data_dir`, `BERTH_DATA_DIR`, `~/.local/share/berth`), as
    the `berth` CLI finds them. `timeout` is every unary call's deadline, in seconds.
    """

    def __init__(
        self,
        address: Optional[str] = None,
        token: Optional[str] = None,
        *,
        data_dir: Optional[os.PathLike] = None,
        name: Optional[str] = None,
        timeout: float = 30.0,
        ca_file: Optional[os.PathLike] = None,
    ) -> None:
        address, token = _connect.resolve(address, token, data_dir, name)
        host, tls = _connect.target(address)
        self.address = address
        self._channel = (
            grpc.secure_channel(host, _connect.credentials(ca_file)) if tls else grpc.insecure_channel(host)
        )
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._timeout = timeout
        self._sandboxes = sandbox_pb2_grpc.SandboxesStub(self._channel)
        self._providers = sandbox_pb2_grpc.ProvidersStub(self._channel)
        self._execs = exec_pb2_grpc.ExecsStub(self._channel)
        self._gateway = gateway_pb2_grpc.GatewayStub(self._channel)
        self._snapshots = snapshots_pb2_grpc.SnapshotsStub(self._channel)
        self._volumes = volumes_pb2_grpc.VolumesStub(self._channel)
        self._files = files_pb2_grpc.FilesStub(self._channel)
        self._logs = logs_pb2_grpc.LogsStub(self._channel)
        self._templates = templates_pb2_grpc.TemplatesStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method, request, timeout: Optional[float] = None):
        try:
            return method(request, metadata=self._metadata, timeout=timeout or self._timeout)
        except grpc.RpcError as e:
            raise from_rpc(e) from None

    def _every(self, method, request, items: str, convert) -> list:
        """Every record a list call has, following every page: `request` makes a page's request
        from its token, `items` names the reply's field, `convert` makes each a value."""
        out: list = []
        token = ""
        while True:
            reply = self._call(method, request(token))
            out.extend(convert(item) for item in getattr(reply, items))
            if not reply.next_page_token:
                return out
            token = reply.next_page_token

    # The gateway.

    def info(self) -> Dict[str, str]:
        """The gateway's version and name, and its store and driver."""
        i = self._call(self._gateway.GetInfo, gateway_pb2.GetInfoRequest())
        return {"version": i.version, "name": i.name, "store": i.store, "driver": i.driver}

    # Sandboxes.

    def create(
        self,
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
        wait: bool = True,
        timeout: float = 120.0,
    ) -> Sandbox:
        """Creates a sandbox running `command` and, with `wait`, returns it once Ready. `image`:
        what a container driver runs, the gateway's default (`host`) if empty. Durations
        are in seconds; `on_expiry` (and `on_idle`, for the idle timeout if not as `on_expiry`) is
        "stop", "delete" or "pause"; `restart` "never", "on-failure" or
        "always". Limits: `cpus` in cores (0.5), `memory` in bytes (swap included), `pids` the
        processes and threads together; a run killed for memory ends in Error OutOfMemory. `allow`:
        where its runs may connect through Berth's egress proxy (host names, `*.suffixes`, CIDR
        blocks); without it, nowhere. `volumes`: `Mount`s of existing volumes. `public_ports`:
        ports the preview proxy serves without a token (every other port needs `port_url`'s)."""
        request = _wire.create_request(
            name,
            command,
            image=image,
            env=env,
            labels=labels,
            providers=providers,
            ttl=ttl,
            idle_timeout=idle_timeout,
            on_expiry=on_expiry,
            restart=restart,
            max_restarts=max_restarts,
            cpus=cpus,
            memory=memory,
            pids=pids,
            allow=allow,
            on_idle=on_idle,
            volumes=volumes,
            public_ports=public_ports,
        )
        return self._create(request, wait, timeout)

    def create_from_snapshot(
        self,
        name: str,
        snapshot: str,
        *,
        labels: Optional[Mapping[str, str]] = None,
        providers: Optional[Iterable[str]] = None,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> Sandbox:
        """Creates a sandbox from `snapshot`: what its source ran (command, image, limits), over
        a copy of its files; and with `wait`, returns it once Ready. Its command runs again from
        the start over those files. `labels` are added to the snapshot's."""
        request = _wire.from_snapshot_request(name, snapshot, labels=labels, providers=providers)
        return self._create(request, wait, timeout)

    def _create(self, request: pb.CreateSandboxRequest, wait: bool, timeout: float) -> Sandbox:
        created = _wire.sandbox(self._call(self._sandboxes.CreateSandbox, request).sandbox)
        return self.wait_for(request.name, "Ready", timeout=timeout) if wait else created

    def get(self, name: str) -> Sandbox:
        return _wire.sandbox(self._call(self._sandboxes.GetSandbox, pb.GetSandboxRequest(name=name)).sandbox)

    def list(self, selector: Optional[Mapping[str, str]] = None) -> List[Sandbox]:
        """Every sandbox whose labels hold `selector`, following every page."""
        return self.list_at(selector).sandboxes

    def list_at(self, selector: Optional[Mapping[str, str]] = None) -> Listing:
        """`list`, with the cursor of its first page: `watch_all` from it misses nothing the
        listing does not show (a sandbox changed while later pages were read may come again:
        compare `resource_version`)."""
        out: List[Sandbox] = []
        cursor: Optional[str] = None
        token = ""
        while True:
            request = pb.ListSandboxesRequest(page_size=500, page_token=token, label_selector=_wire.selector(selector))
            reply = self._call(self._sandboxes.ListSandboxes, request)
            cursor = reply.cursor if cursor is None else cursor
            out.extend(_wire.sandbox(s) for s in reply.sandboxes)
            if not reply.next_page_token:
                return Listing(out, cursor)
            token = reply.next_page_token

    def watch_all(
        self,
        selector: Optional[Mapping[str, str]] = None,
        cursor: str = "",
        timeout: Optional[float] = None,
    ) -> Iterator[Change]:
        """Every change to every sandbox `selector` picks, after `cursor` (from `list_at` or a
        change; empty: from now), beginning with a bookmark at that cursor. Reconnecting with the
        last change's cursor misses nothing and repeats nothing; `FailedPrecondition` means the
        cursor is too old: list again."""
        request = pb.WatchSandboxesRequest(label_selector=_wire.selector(selector), cursor=cursor)
        stream = self._sandboxes.WatchSandboxes(request, metadata=self._metadata, timeout=timeout)
        try:
            for event in stream:
                yield _wire.change(event)
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        finally:
            stream.cancel()

    def watch(self, name: str, timeout: Optional[float] = None) -> Iterator[Optional[Sandbox]]:
        """The sandbox as it is, then at every change; `None` once it is removed (the end)."""
        stream = self._sandboxes.WatchSandbox(pb.WatchSandboxRequest(name=name), metadata=self._metadata, timeout=timeout)
        try:
            for event in stream:
                if not event.HasField("sandbox"):
                    yield None
                    return
                yield _wire.sandbox(event.sandbox)
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        finally:
            stream.cancel()

    def wait_for(self, name: str, phase: Optional[str], *, timeout: float = 120.0) -> Optional[Sandbox]:
        """Waits until the sandbox is in `phase` (`None`: gone). Raises `SandboxFailed` if it
        lands in Error on the way, `WaitTimeout` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        try:
            for s in self.watch(name, timeout=timeout):
                if s is None:
                    if phase is None:
                        return None
                    raise SandboxFailed(name, "Deleted", "the sandbox was deleted")
                if s.phase == phase or (phase == "Ready" and s.phase == "Stopped" and s.completed):
                    return s
                if s.phase == "Error" and phase in ("Ready", "Paused", "Stopped"):
                    f = s.failure
                    raise SandboxFailed(name, f.reason if f else "Error", f.message if f else "")
        except BerthError as e:
            if e.code == grpc.StatusCode.NOT_FOUND and phase is None:
                return None
            if e.code == grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() >= deadline:
                raise WaitTimeout(name, phase or "gone", timeout) from None
            raise
        raise Unavailable(grpc.StatusCode.UNAVAILABLE, f"the watch of '{name}' ended early")

    def _lifecycle(
        self, verb: str, name: str, expected_version: Optional[int], wait: bool, timeout: float, checkpoint: bool = False
    ):
        request = _wire.lifecycle_request(verb, name, expected_version, checkpoint)
        method = getattr(self._sandboxes, _wire.LIFECYCLE_RPCS[verb])
        accepted = _wire.sandbox(self._call(method, request).sandbox)
        return self.wait_for(name, _wire.TARGETS[verb], timeout=timeout) if wait else accepted

    def stop(self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0) -> Sandbox:
        return self._lifecycle("stop", name, expected_version, wait, timeout)

    def start(self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0) -> Sandbox:
        return self._lifecycle("start", name, expected_version, wait, timeout)

    def pause(
        self,
        name: str,
        *,
        checkpoint: bool = False,
        expected_version: Optional[int] = None,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> Sandbox:
        """Freezes a Ready sandbox's processes, memory kept, and with `wait` returns it once Paused.
        Nothing restarts: generation and identity stay. No exec runs while it is paused. With
        `checkpoint`, the memory goes to disk instead (CRIU, rootful Podman only: elsewhere
        `FailedPrecondition`, saying why), and the pause outlives a reboot of the host."""
        return self._lifecycle("pause", name, expected_version, wait, timeout, checkpoint)

    def resume(self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0) -> Sandbox:
        """Thaws (or restores from its checkpoint) a paused sandbox, and with `wait` returns it
        once Ready again."""
        return self._lifecycle("resume", name, expected_version, wait, timeout)

    def delete(self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0) -> None:
        self._lifecycle("delete", name, expected_version, wait, timeout)

    def renew(
        self,
        name: str,
        *,
        ttl: Optional[float] = None,
        deadline: Optional[float] = None,
        expected_version: Optional[int] = None,
    ) -> Sandbox:
        """A new deadline: `ttl` seconds from now, or `deadline` (Unix seconds), or with neither
        the spec's TTL from now."""
        request = _wire.renew_request(name, ttl, deadline, expected_version)
        return _wire.sandbox(self._call(self._sandboxes.RenewSandbox, request).sandbox)

    # Templates and warm pools.

    def create_template(self, name: str, command: Sequence[str], *, min_ready: int = 0, **spec) -> Template:
        """A named spec (`create`'s options: image, env, labels, ttl, restart, limits...) whose
        pool keeps `min_ready` sandboxes Ready to `claim`."""
        sandbox = _wire.create_request(name, command, **spec)
        request = pt.CreateTemplateRequest(name=name, spec=sandbox.spec, min_ready=min_ready)
        return _wire.template(self._call(self._templates.CreateTemplate, request).template)

    def get_template(self, name: str) -> Template:
        return _wire.template(self._call(self._templates.GetTemplate, pt.GetTemplateRequest(name=name)).template)

    def list_templates(self) -> List[Template]:
        page = _wire.page(pt.ListTemplatesRequest)
        return self._every(self._templates.ListTemplates, page, "templates", _wire.template)

    def delete_template(self, name: str, *, expected_version: Optional[int] = None) -> None:
        """Deletes the template and its unclaimed pool members; claimed sandboxes stay."""
        request = pt.DeleteTemplateRequest(name=name, expected_resource_version=expected_version)
        self._call(self._templates.DeleteTemplate, request)

    def set_pool(self, template: str, min_ready: int) -> Template:
        request = pt.SetPoolRequest(template=template, min_ready=min_ready)
        return _wire.template(self._call(self._templates.SetPool, request).template)

    def claim(
        self,
        template: str,
        *,
        labels: Optional[Mapping[str, str]] = None,
        providers: Optional[Iterable[str]] = None,
        wait: Optional[float] = None,
    ) -> Sandbox:
        """A Ready sandbox from the template's pool, never one another claim got. With none
        Ready: `Unavailable` at once, or after waiting up to `wait` seconds for one."""
        request = _wire.claim_request(template, labels, providers, wait)
        deadline = self._timeout + (wait or 0)
        return _wire.sandbox(self._call(self._templates.ClaimSandbox, request, timeout=deadline).sandbox)

    # Snapshots and forks.

    def create_snapshot(self, name: str, sandbox: str, *, wait: bool = True, timeout: float = 120.0) -> Snapshot:
        """Copies the files of `sandbox` (Ready: frozen only for the copy; Paused or Stopped) as
        snapshot `name`. With `wait` the gateway answers once the copy is Ready, within `timeout`
        seconds (`FailedPrecondition` if it failed: the snapshot then stays in Error until
        deleted); without, at once, Creating."""
        request = ps.CreateSnapshotRequest(name=name, sandbox=sandbox, no_wait=not wait)
        return _wire.snapshot(self._call(self._snapshots.CreateSnapshot, request, timeout if wait else None).snapshot)

    def get_snapshot(self, name: str) -> Snapshot:
        return _wire.snapshot(self._call(self._snapshots.GetSnapshot, ps.GetSnapshotRequest(name=name)).snapshot)

    def list_snapshots(self) -> List[Snapshot]:
        """Every snapshot, following every page."""
        page = _wire.page(ps.ListSnapshotsRequest)
        return self._every(self._snapshots.ListSnapshots, page, "snapshots", _wire.snapshot)

    def delete_snapshot(
        self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0
    ) -> Optional[Snapshot]:
        """Deletes the snapshot and everything kept of it: refused (`FailedPrecondition`, naming
        them) while a sandbox made from it has not had its files yet. The gateway answers with it
        Deleting, which is returned without `wait`; with `wait`, returns `None` once it is gone."""
        request = ps.DeleteSnapshotRequest(name=name, expected_resource_version=expected_version)
        deleting = _wire.snapshot(self._call(self._snapshots.DeleteSnapshot, request).snapshot)
        if not wait:
            return deleting
        return self._gone(self.get_snapshot, name, deleting.id, timeout)

    def fork(
        self,
        name: str,
        count: int = 1,
        *,
        names: Optional[Sequence[str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> List[Sandbox]:
        """Makes `count` sandboxes from one point of sandbox `name`'s files (Ready: frozen only
        for the copy, and it runs on; Paused or Stopped): all of them or none. They are `names`
        (`count` of them), else `<name>-1`, `<name>-2`, .. (the lowest numbers free), and carry
        `labels` beside `berth.fork-of` (the source) and `berth.snapshot` (the snapshot the fork
        took, removed once no fork needs it). The gateway answers once the copy is made, within
        `timeout` seconds, each fork starting; with `wait`, returns them once each is Ready
        (each within `timeout`)."""
        request = _wire.fork_request(name, count, names=names, labels=labels)
        forks = [_wire.sandbox(s) for s in self._call(self._snapshots.ForkSandbox, request, timeout).sandboxes]
        if not wait:
            return forks
        return [self.wait_for(f.name, "Ready", timeout=timeout) for f in forks]

    # Volumes.

    def create_volume(self, name: str) -> Volume:
        """A volume: files that outlive the sandboxes that mount them (`create(..., volumes=[Mount(name, path)])`)."""
        return _wire.volume(self._call(self._volumes.CreateVolume, pv.CreateVolumeRequest(name=name)).volume)

    def get_volume(self, name: str) -> Volume:
        return _wire.volume(self._call(self._volumes.GetVolume, pv.GetVolumeRequest(name=name)).volume)

    def list_volumes(self) -> List[Volume]:
        """Every volume, following every page."""
        return self._every(self._volumes.ListVolumes, _wire.page(pv.ListVolumesRequest), "volumes", _wire.volume)

    def delete_volume(
        self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0
    ) -> Optional[Volume]:
        """Deletes the volume and its files: refused (`FailedPrecondition`, naming them) while a
        sandbox that is not being deleted mounts it. The gateway answers with it Deleting, which
        is returned without `wait`; with `wait`, returns `None` once its files and record are gone."""
        request = pv.DeleteVolumeRequest(name=name, expected_resource_version=expected_version)
        deleting = _wire.volume(self._call(self._volumes.DeleteVolume, request).volume)
        if not wait:
            return deleting
        return self._gone(self.get_volume, name, deleting.id, timeout)

    def _gone(self, read, name: str, id: str, timeout: float) -> None:
        """Waits until record `name` (this one, by its `id`) is gone: nothing watches snapshots
        and volumes, so it is read again (`read`) until then."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if read(name).id != id:
                    return None
            except NotFound:
                return None
            if time.monotonic() >= deadline:
                raise WaitTimeout(name, "gone", timeout)
            time.sleep(_wire.RECORD_POLL)

    # Ports.

    def port_url(self, name: str, port: int) -> PortUrl:
        """A URL of the gateway's preview proxy (`--proxy-listen`) reaching `port` of sandbox
        `name`'s current run, its access token in the query unless the port is public. The
        token is the run's: after a stop and start it gets 410 Gone; ask again."""
        request = pb.GetPortUrlRequest(name=name, port=port)
        return _wire.port_url(self._call(self._sandboxes.GetPortUrl, request))

    # Providers.

    def create_provider(
        self, name: str, kind: str, credentials: Mapping[str, str], endpoints: Optional[Iterable[str]] = None
    ) -> Provider:
        """`endpoints`: where the credentials are for; a sandbox it is attached to reaches them
        from its next start."""
        request = pb.CreateProviderRequest(
            name=name, kind=kind, credentials=dict(credentials), endpoints=list(endpoints or [])
        )
        return _wire.provider(self._call(self._providers.CreateProvider, request).provider)

    def get_provider(self, name: str) -> Provider:
        return _wire.provider(self._call(self._providers.GetProvider, pb.GetProviderRequest(name=name)).provider)

    def list_providers(self) -> List[Provider]:
        page = _wire.page(pb.ListProvidersRequest)
        return self._every(self._providers.ListProviders, page, "providers", _wire.provider)

    def delete_provider(self, name: str, *, expected_version: Optional[int] = None) -> None:
        self._call(self._providers.DeleteProvider, pb.DeleteProviderRequest(name=name, expected_resource_version=expected_version))

    def attach_provider(self, sandbox: str, provider: str) -> Sandbox:
        reply = self._call(self._providers.AttachProvider, pb.AttachRequest(sandbox=sandbox, provider=provider))
        return _wire.sandbox(reply.sandbox)

    def detach_provider(self, sandbox: str, provider: str) -> Sandbox:
        reply = self._call(self._providers.DetachProvider, pb.AttachRequest(sandbox=sandbox, provider=provider))
        return _wire.sandbox(reply.sandbox)

    # Execs.

    def exec_stream(
        self,
        sandbox: str,
        argv: Sequence[str],
        *,
        exec_id: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Optional[bytes] = None,
        collector: Optional[_wire.Collector] = None,
    ) -> Iterator[Chunk]:
        """Runs `argv` in the Ready sandbox, yielding its output as it comes; `collector` (if
        given) holds the end once the stream is over. The exec has an id (one is made if none is
        given): should the gateway go away mid-stream, the stream is opened again with that id,
        which attaches to the same exec from where the output got to; it never runs twice."""
        collector = collector if collector is not None else _wire.Collector()
        exec_id = exec_id or f"py-{uuid.uuid4().hex}"
        start = _wire.exec_start(sandbox, argv, exec_id=exec_id, env=env, cwd=cwd, timeout=timeout, stdin=stdin is not None)
        def run():
            return self._execs.Exec(iter([start] + _wire.stdin_messages(stdin)), metadata=self._metadata)

        def attach():
            request = pe.AttachExecRequest(sandbox=sandbox, exec_id=exec_id, offset=collector.offset)
            return self._execs.AttachExec(request, metadata=self._metadata)

        for attempt in range(EXEC_RETRIES + 1):
            # Opened again, the stream attaches (so stdin is never sent twice), unless the exec
            # was never admitted: then it is run, as the first time.
            call = attach() if attempt > 0 else run()
            try:
                try:
                    messages = _first_then_rest(call)
                except grpc.RpcError as e:
                    if attempt == 0 or collector.admitted or e.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    call = run()
                    messages = iter(call)
                for message in messages:
                    new = collector.take(message)
                    if new is not None:
                        yield new
                    if collector.end is not None:
                        return
                raise Unavailable(grpc.StatusCode.UNAVAILABLE, f"exec {exec_id}: the stream ended before the exec")
            except (grpc.RpcError, Unavailable) as e:
                error = from_rpc(e) if isinstance(e, grpc.RpcError) else e
                if not isinstance(error, Unavailable) or attempt == EXEC_RETRIES:
                    raise error from None
                time.sleep(min(0.1 * 2**attempt, 2.0))
            finally:
                call.cancel()
        raise Unavailable(grpc.StatusCode.UNAVAILABLE, f"exec {exec_id}: the stream kept breaking before its end")

    def exec(self, sandbox: str, argv: Sequence[str], **options) -> ExecResult:  # noqa: A003
        """Runs `argv` in the Ready sandbox to its end: its output and how it ended. Takes the
        options of `exec_stream`."""
        collector = _wire.Collector()
        for _ in self.exec_stream(sandbox, argv, collector=collector, **options):
            pass
        return _wire.finished(collector, sandbox, options.get("timeout"))

    def get_exec(self, sandbox: str, exec_id: str) -> Exec:
        reply = self._call(self._execs.GetExec, pe.ExecRequest(sandbox=sandbox, exec_id=exec_id))
        return _wire.exec_record(reply.exec)

    def cancel_exec(self, sandbox: str, exec_id: str) -> Exec:
        reply = self._call(self._execs.CancelExec, pe.ExecRequest(sandbox=sandbox, exec_id=exec_id))
        return _wire.exec_record(reply.exec)

    # Logs.

    def logs(self, sandbox: str, *, generation: int = 0, offset: int = 0, follow: bool = False) -> Iterator[Chunk]:
        """What the sandbox's main process wrote (generation 0: the current run's), from
        `offset`; with `follow`, on as it writes until its run ends."""
        at = offset
        try:
            for message in self._logs.ReadLogs(_wire.logs_request(sandbox, generation, offset, follow), metadata=self._metadata):
                chunk, at = _wire.log_chunk(message, at)
                if chunk is not None:
                    yield chunk
        except grpc.RpcError as e:
            raise from_rpc(e) from None

    # Files.

    def write_file(self, sandbox: str, path: str, data, *, mode: int = 0o644) -> None:
        """Writes `data` (bytes, or str as UTF-8) as the file `path` (relative to the workspace,
        or under /workspace), its directories made, over a file already there."""
        directory, archive = _files.one_file(path, data, mode)
        self._upload(sandbox, directory, archive)

    def read_file(self, sandbox: str, path: str) -> bytes:
        """The content of the file `path` (relative to the workspace, or under /workspace)."""
        return _files.file_content(self._download(sandbox, path), path)

    def upload(self, sandbox: str, local: os.PathLike, path: str = "") -> List[str]:
        """Copies the local file or directory `local` into the directory `path` of the workspace
        (made if missing; "" is the workspace), under its own name; the paths written."""
        return self._upload(sandbox, path, _files.local(local))

    def download(self, sandbox: str, path: str, local: os.PathLike) -> List[str]:
        """Copies the file or directory `path` of the workspace into the local directory `local`
        (made if missing), under its own name; the paths written, relative to `local`."""
        return _files.extract(self._download(sandbox, path), local)

    def _upload(self, sandbox: str, directory: str, archive: bytes) -> List[str]:
        try:
            reply = self._files.Upload(_wire.upload_inputs(sandbox, directory, archive), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        return [f.path for f in reply.files]

    def _download(self, sandbox: str, path: str) -> bytes:
        archive = bytearray()
        try:
            for message in self._files.Download(pf.DownloadRequest(sandbox=sandbox, path=path), metadata=self._metadata):
                archive.extend(_wire.download_data(message))
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        return bytes(archive)
