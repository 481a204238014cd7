"""Files in and out of a sandbox's workspace as the gateway carries them, tar streams, for the
sync and asyncio clients alike: what to upload for a file or a local path, and what to take
out of a download."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Iterator, List, Tuple, Union

#: How much of an archive one upload message carries.
CHUNK = 1 << 20


def one_file(path: str, data: Union[bytes, str], mode: int) -> Tuple[str, bytes]:
    """The directory to unpack into (relative to the workspace, or under /workspace; "" for the
    workspace itself) and the archive holding `data` as the file `path` names."""
    name = PurePosixPath(path).name
    if not name or name in (".", ".."):
        raise ValueError(f"path: {path!r} names no file")
    content = data.encode() if isinstance(data, str) else bytes(data)
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(content), mode, int(time.time())
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.addfile(info, io.BytesIO(content))
    parent = str(PurePosixPath(path).parent)
    return ("" if parent == "." else parent), archive.getvalue()


def local(path: os.PathLike) -> bytes:
    """An archive of the local file or directory `path`, under its own name."""
    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"{source}: no such file or directory")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(str(source), arcname=source.resolve().name)
    return archive.getvalue()


def chunks(archive: bytes) -> Iterator[bytes]:
    for at in range(0, len(archive), CHUNK):
        yield archive[at : at + CHUNK]


def file_content(archive: bytes, path: str) -> bytes:
    """The content of the one file a download of `path` brought."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        members = tar.getmembers()
        if len(members) != 1 or not members[0].isfile():
            raise IsADirectoryError(f"{path}: not a file (a download of it holds {len(members)} entries)")
        extracted = tar.extractfile(members[0])
        assert extracted is not None, "a regular file has content"
        return extracted.read()


def extract(archive: bytes, into: os.PathLike) -> List[str]:
    """Unpacks a download into the local directory `into` (made if missing); the paths written,
    relative to it. An entry that would land outside it (an absolute path, `..`, a link out) is
    refused, whatever the archive says."""
    target = Path(into)
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    written = []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        members = tar.getmembers()
        for member in members:
            where = (root / member.name).resolve()
            if root not in where.parents and where != root:
                raise ValueError(f"{member.name!r}: outside {target}, refused")
            if member.issym() or member.islnk():
                link = (where.parent / member.linkname).resolve()
                if root not in link.parents and link != root:
                    raise ValueError(f"{member.name!r}: a link out of {target}, refused")
            written.append(member.name)
        # Where the interpreter has extraction filters (3.12, and backports), its own check too.
        checked = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        for member in members:
            tar.extract(member, str(root), **checked)
    return written
