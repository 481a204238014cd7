"""The asyncio client: `Client`'s API, every call a coroutine (`watch` and `exec_stream` async
iterators)."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import AsyncIterator, Dict, Iterable, List, Mapping, Optional, Sequence

import grpc
import grpc.aio

from berth.v1 import exec_pb2 as pe
from berth.v1 import exec_pb2_grpc
from berth.v1 import files_pb2 as pf
from berth.v1 import files_pb2_grpc, gateway_pb2, gateway_pb2_grpc, logs_pb2_grpc
from berth.v1 import sandbox_pb2 as pb
from berth.v1 import sandbox_pb2_grpc
from berth.v1 import snapshots_pb2 as ps
from berth.v1 import snapshots_pb2_grpc
from berth.v1 import templates_pb2 as pt
from berth.v1 import templates_pb2_grpc
from berth.v1 import volumes_pb2 as pv
from berth.v1 import volumes_pb2_grpc

from . import _connect, _files, _wire
from .client import EXEC_RETRIES
from .errors import BerthError, NotFound, SandboxFailed, Unavailable, WaitTimeout, from_rpc
from .types import Change, Chunk, Exec, ExecResult, Listing, Mount, PortUrl, Provider, Sandbox, Snapshot, Template, Volume


class AsyncClient:
    """A connection to one Berth gateway, for asyncio: `async with AsyncClient() as client:`.
    Found and configured as `berth.Client` is."""

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
            grpc.aio.secure_channel(host, _connect.credentials(ca_file)) if tls else grpc.aio.insecure_channel(host)
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

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _call(self, method, request, timeout: Optional[float] = None):
        try:
            return await method(request, metadata=self._metadata, timeout=timeout or self._timeout)
        except grpc.RpcError as e:
            raise from_rpc(e) from None

    async def _every(self, method, request, items: str, convert) -> list:
        """As `Client._every`."""
        out: list = []
        token = ""
        while True:
            reply = await self._call(method, request(token))
            out.extend(convert(item) for item in getattr(reply, items))
            if not reply.next_page_token:
                return out
            token = reply.next_page_token

    async def info(self) -> Dict[str, str]:
        i = await self._call(self._gateway.GetInfo, gateway_pb2.GetInfoRequest())
        return {"version": i.version, "name": i.name, "store": i.store, "driver": i.driver}

    async def create(
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
        return await self._create(request, wait, timeout)

    async def create_from_snapshot(
        self,
        name: str,
        snapshot: str,
        *,
        labels: Optional[Mapping[str, str]] = None,
        providers: Optional[Iterable[str]] = None,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> Sandbox:
        """As `Client.create_from_snapshot`: the snapshot's source's spec over a copy of its files."""
        request = _wire.from_snapshot_request(name, snapshot, labels=labels, providers=providers)
        return await self._create(request, wait, timeout)

    async def _create(self, request: pb.CreateSandboxRequest, wait: bool, timeout: float) -> Sandbox:
        created = _wire.sandbox((await self._call(self._sandboxes.CreateSandbox, request)).sandbox)
        return await self.wait_for(request.name, "Ready", timeout=timeout) if wait else created

    async def get(self, name: str) -> Sandbox:
        reply = await self._call(self._sandboxes.GetSandbox, pb.GetSandboxRequest(name=name))
        return _wire.sandbox(reply.sandbox)

    async def list(self, selector: Optional[Mapping[str, str]] = None) -> List[Sandbox]:
        return (await self.list_at(selector)).sandboxes

    async def list_at(self, selector: Optional[Mapping[str, str]] = None) -> Listing:
        out: List[Sandbox] = []
        cursor: Optional[str] = None
        token = ""
        while True:
            request = pb.ListSandboxesRequest(page_size=500, page_token=token, label_selector=_wire.selector(selector))
            reply = await self._call(self._sandboxes.ListSandboxes, request)
            cursor = reply.cursor if cursor is None else cursor
            out.extend(_wire.sandbox(s) for s in reply.sandboxes)
            if not reply.next_page_token:
                return Listing(out, cursor)
            token = reply.next_page_token

    async def watch_all(
        self,
        selector: Optional[Mapping[str, str]] = None,
        cursor: str = "",
        timeout: Optional[float] = None,
    ) -> AsyncIterator[Change]:
        request = pb.WatchSandboxesRequest(label_selector=_wire.selector(selector), cursor=cursor)
        call = self._sandboxes.WatchSandboxes(request, metadata=self._metadata, timeout=timeout)
        try:
            async for event in call:
                yield _wire.change(event)
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        finally:
            call.cancel()

    async def watch(self, name: str, timeout: Optional[float] = None) -> AsyncIterator[Optional[Sandbox]]:
        call = self._sandboxes.WatchSandbox(pb.WatchSandboxRequest(name=name), metadata=self._metadata, timeout=timeout)
        try:
            async for event in call:
                if not event.HasField("sandbox"):
                    yield None
                    return
                yield _wire.sandbox(event.sandbox)
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        finally:
            call.cancel()

    async def wait_for(self, name: str, phase: Optional[str], *, timeout: float = 120.0) -> Optional[Sandbox]:
        try:
            async for s in self.watch(name, timeout=timeout):
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
            if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise WaitTimeout(name, phase or "gone", timeout) from None
            raise
        raise Unavailable(grpc.StatusCode.UNAVAILABLE, f"the watch of '{name}' ended early")

    async def _lifecycle(
        self, verb: str, name: str, expected_version: Optional[int], wait: bool, timeout: float, checkpoint: bool = False
    ):
        request = _wire.lifecycle_request(verb, name, expected_version, checkpoint)
        method = getattr(self._sandboxes, _wire.LIFECYCLE_RPCS[verb])
        accepted = _wire.sandbox((await self._call(method, request)).sandbox)
        return await self.wait_for(name, _wire.TARGETS[verb], timeout=timeout) if wait else accepted

    async def stop(self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0) -> Sandbox:
        return await self._lifecycle("stop", name, expected_version, wait, timeout)

    async def start(self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0) -> Sandbox:
        return await self._lifecycle("start", name, expected_version, wait, timeout)

    async def pause(
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
        return await self._lifecycle("pause", name, expected_version, wait, timeout, checkpoint)

    async def resume(self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0) -> Sandbox:
        """Thaws (or restores from its checkpoint) a paused sandbox, and with `wait` returns it
        once Ready again."""
        return await self._lifecycle("resume", name, expected_version, wait, timeout)

    async def delete(self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0) -> None:
        await self._lifecycle("delete", name, expected_version, wait, timeout)

    async def renew(
        self,
        name: str,
        *,
        ttl: Optional[float] = None,
        deadline: Optional[float] = None,
        expected_version: Optional[int] = None,
    ) -> Sandbox:
        request = _wire.renew_request(name, ttl, deadline, expected_version)
        return _wire.sandbox((await self._call(self._sandboxes.RenewSandbox, request)).sandbox)

    async def create_template(self, name: str, command: Sequence[str], *, min_ready: int = 0, **spec) -> Template:
        sandbox = _wire.create_request(name, command, **spec)
        request = pt.CreateTemplateRequest(name=name, spec=sandbox.spec, min_ready=min_ready)
        return _wire.template((await self._call(self._templates.CreateTemplate, request)).template)

    async def get_template(self, name: str) -> Template:
        reply = await self._call(self._templates.GetTemplate, pt.GetTemplateRequest(name=name))
        return _wire.template(reply.template)

    async def list_templates(self) -> List[Template]:
        page = _wire.page(pt.ListTemplatesRequest)
        return await self._every(self._templates.ListTemplates, page, "templates", _wire.template)

    async def delete_template(self, name: str, *, expected_version: Optional[int] = None) -> None:
        request = pt.DeleteTemplateRequest(name=name, expected_resource_version=expected_version)
        await self._call(self._templates.DeleteTemplate, request)

    async def set_pool(self, template: str, min_ready: int) -> Template:
        request = pt.SetPoolRequest(template=template, min_ready=min_ready)
        return _wire.template((await self._call(self._templates.SetPool, request)).template)

    async def claim(
        self,
        template: str,
        *,
        labels: Optional[Mapping[str, str]] = None,
        providers: Optional[Iterable[str]] = None,
        wait: Optional[float] = None,
    ) -> Sandbox:
        request = _wire.claim_request(template, labels, providers, wait)
        reply = await self._call(self._templates.ClaimSandbox, request, timeout=self._timeout + (wait or 0))
        return _wire.sandbox(reply.sandbox)

    async def create_snapshot(self, name: str, sandbox: str, *, wait: bool = True, timeout: float = 120.0) -> Snapshot:
        """As `Client.create_snapshot`: with `wait`, answered once the copy is Ready."""
        request = ps.CreateSnapshotRequest(name=name, sandbox=sandbox, no_wait=not wait)
        reply = await self._call(self._snapshots.CreateSnapshot, request, timeout if wait else None)
        return _wire.snapshot(reply.snapshot)

    async def get_snapshot(self, name: str) -> Snapshot:
        reply = await self._call(self._snapshots.GetSnapshot, ps.GetSnapshotRequest(name=name))
        return _wire.snapshot(reply.snapshot)

    async def list_snapshots(self) -> List[Snapshot]:
        page = _wire.page(ps.ListSnapshotsRequest)
        return await self._every(self._snapshots.ListSnapshots, page, "snapshots", _wire.snapshot)

    async def delete_snapshot(
        self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0
    ) -> Optional[Snapshot]:
        """As `Client.delete_snapshot`: with `wait`, `None` once it is gone."""
        request = ps.DeleteSnapshotRequest(name=name, expected_resource_version=expected_version)
        deleting = _wire.snapshot((await self._call(self._snapshots.DeleteSnapshot, request)).snapshot)
        if not wait:
            return deleting
        return await self._gone(self.get_snapshot, name, deleting.id, timeout)

    async def fork(
        self,
        name: str,
        count: int = 1,
        *,
        names: Optional[Sequence[str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> List[Sandbox]:
        """As `Client.fork`: all `count` forks or none; with `wait`, each once Ready."""
        request = _wire.fork_request(name, count, names=names, labels=labels)
        forks = [_wire.sandbox(s) for s in (await self._call(self._snapshots.ForkSandbox, request, timeout)).sandboxes]
        if not wait:
            return forks
        # They start together at the gateway: waiting for each in turn takes as long as for all.
        return [await self.wait_for(f.name, "Ready", timeout=timeout) for f in forks]

    # Volumes.

    async def create_volume(self, name: str) -> Volume:
        """As `Client.create_volume`."""
        return _wire.volume((await self._call(self._volumes.CreateVolume, pv.CreateVolumeRequest(name=name))).volume)

    async def get_volume(self, name: str) -> Volume:
        return _wire.volume((await self._call(self._volumes.GetVolume, pv.GetVolumeRequest(name=name))).volume)

    async def list_volumes(self) -> List[Volume]:
        """Every volume, following every page."""
        return await self._every(self._volumes.ListVolumes, _wire.page(pv.ListVolumesRequest), "volumes", _wire.volume)

    async def delete_volume(
        self, name: str, *, expected_version: Optional[int] = None, wait: bool = True, timeout: float = 120.0
    ) -> Optional[Volume]:
        """As `Client.delete_volume`: with `wait`, `None` once it is gone."""
        request = pv.DeleteVolumeRequest(name=name, expected_resource_version=expected_version)
        deleting = _wire.volume((await self._call(self._volumes.DeleteVolume, request)).volume)
        if not wait:
            return deleting
        return await self._gone(self.get_volume, name, deleting.id, timeout)

    async def _gone(self, read, name: str, id: str, timeout: float) -> None:
        """As `Client._gone`."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                if (await read(name)).id != id:
                    return None
            except NotFound:
                return None
            if asyncio.get_running_loop().time() >= deadline:
                raise WaitTimeout(name, "gone", timeout)
            await asyncio.sleep(_wire.RECORD_POLL)

    async def port_url(self, name: str, port: int) -> PortUrl:
        """As `Client.port_url`."""
        return _wire.port_url(await self._call(self._sandboxes.GetPortUrl, pb.GetPortUrlRequest(name=name, port=port)))

    async def create_provider(
        self, name: str, kind: str, credentials: Mapping[str, str], endpoints: Optional[Iterable[str]] = None
    ) -> Provider:
        """`endpoints`: where the credentials are for; a sandbox it is attached to reaches them
        from its next start."""
        request = pb.CreateProviderRequest(
            name=name, kind=kind, credentials=dict(credentials), endpoints=list(endpoints or [])
        )
        return _wire.provider((await self._call(self._providers.CreateProvider, request)).provider)

    async def get_provider(self, name: str) -> Provider:
        reply = await self._call(self._providers.GetProvider, pb.GetProviderRequest(name=name))
        return _wire.provider(reply.provider)

    async def delete_provider(self, name: str, *, expected_version: Optional[int] = None) -> None:
        request = pb.DeleteProviderRequest(name=name, expected_resource_version=expected_version)
        await self._call(self._providers.DeleteProvider, request)

    async def attach_provider(self, sandbox: str, provider: str) -> Sandbox:
        reply = await self._call(self._providers.AttachProvider, pb.AttachRequest(sandbox=sandbox, provider=provider))
        return _wire.sandbox(reply.sandbox)

    async def detach_provider(self, sandbox: str, provider: str) -> Sandbox:
        reply = await self._call(self._providers.DetachProvider, pb.AttachRequest(sandbox=sandbox, provider=provider))
        return _wire.sandbox(reply.sandbox)

    async def exec_stream(
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
    ) -> AsyncIterator[Chunk]:
        """As `Client.exec_stream`: retried with its id, attached from where it got to."""
        collector = collector if collector is not None else _wire.Collector()
        exec_id = exec_id or f"py-{uuid.uuid4().hex}"
        start = _wire.exec_start(sandbox, argv, exec_id=exec_id, env=env, cwd=cwd, timeout=timeout, stdin=stdin is not None)

        def run():
            return self._execs.Exec(iter([start] + _wire.stdin_messages(stdin)), metadata=self._metadata)

        for attempt in range(EXEC_RETRIES + 1):
            if attempt == 0:
                call = run()
            else:
                request = pe.AttachExecRequest(sandbox=sandbox, exec_id=exec_id, offset=collector.offset)
                call = self._execs.AttachExec(request, metadata=self._metadata)
            try:
                try:
                    first = await call.read()
                except grpc.RpcError as e:
                    if attempt == 0 or collector.admitted or e.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    call = run()
                    first = await call.read()
                message = first
                while message is not grpc.aio.EOF:
                    new = collector.take(message)
                    if new is not None:
                        yield new
                    if collector.end is not None:
                        return
                    message = await call.read()
                raise Unavailable(grpc.StatusCode.UNAVAILABLE, f"exec {exec_id}: the stream ended before the exec")
            except (grpc.RpcError, Unavailable) as e:
                error = from_rpc(e) if isinstance(e, grpc.RpcError) else e
                if not isinstance(error, Unavailable) or attempt == EXEC_RETRIES:
                    raise error from None
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
            finally:
                call.cancel()
        raise Unavailable(grpc.StatusCode.UNAVAILABLE, f"exec {exec_id}: the stream kept breaking before its end")

    async def exec(self, sandbox: str, argv: Sequence[str], **options) -> ExecResult:
        collector = _wire.Collector()
        async for _ in self.exec_stream(sandbox, argv, collector=collector, **options):
            pass
        return _wire.finished(collector, sandbox, options.get("timeout"))

    async def get_exec(self, sandbox: str, exec_id: str) -> Exec:
        reply = await self._call(self._execs.GetExec, pe.ExecRequest(sandbox=sandbox, exec_id=exec_id))
        return _wire.exec_record(reply.exec)

    async def cancel_exec(self, sandbox: str, exec_id: str) -> Exec:
        reply = await self._call(self._execs.CancelExec, pe.ExecRequest(sandbox=sandbox, exec_id=exec_id))
        return _wire.exec_record(reply.exec)

    async def logs(
        self, sandbox: str, *, generation: int = 0, offset: int = 0, follow: bool = False
    ) -> AsyncIterator[Chunk]:
        at = offset
        try:
            request = _wire.logs_request(sandbox, generation, offset, follow)
            async for message in self._logs.ReadLogs(request, metadata=self._metadata):
                chunk, at = _wire.log_chunk(message, at)
                if chunk is not None:
                    yield chunk
        except grpc.RpcError as e:
            raise from_rpc(e) from None

    async def write_file(self, sandbox: str, path: str, data, *, mode: int = 0o644) -> None:
        directory, archive = _files.one_file(path, data, mode)
        await self._upload(sandbox, directory, archive)

    async def read_file(self, sandbox: str, path: str) -> bytes:
        return _files.file_content(await self._download(sandbox, path), path)

    async def upload(self, sandbox: str, local: os.PathLike, path: str = "") -> List[str]:
        return await self._upload(sandbox, path, _files.local(local))

    async def download(self, sandbox: str, path: str, local: os.PathLike) -> List[str]:
        return _files.extract(await self._download(sandbox, path), local)

    async def _upload(self, sandbox: str, directory: str, archive: bytes) -> List[str]:
        try:
            reply = await self._files.Upload(_wire.upload_inputs(sandbox, directory, archive), metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        return [f.path for f in reply.files]

    async def _download(self, sandbox: str, path: str) -> bytes:
        archive = bytearray()
        try:
            request = pf.DownloadRequest(sandbox=sandbox, path=path)
            async for message in self._files.Download(request, metadata=self._metadata):
                archive.extend(_wire.download_data(message))
        except grpc.RpcError as e:
            raise from_rpc(e) from None
        return bytes(archive)
