"""E2B's files through the unmodified SDK, over the sandbox's workspace: write (one file, several,
bytes), read (text and bytes), list, exists, get_info, make_dir, rename, remove; paths outside
the workspace refused naming them."""

from __future__ import annotations

import pytest
import httpx
from e2b import FileType, Sandbox
from e2b.exceptions import FileNotFoundException, InvalidArgumentException, SandboxException


@pytest.fixture
def sandbox(gateway):
    s = Sandbox.create(timeout=300)
    yield s
    s.kill()


def test_a_file_written_is_read_back_and_seen_by_commands(sandbox):
    info = sandbox.files.write("/workspace/notes/a.txt", "hello")
    assert (info.name, info.path, info.type) == ("a.txt", "/workspace/notes/a.txt", FileType.FILE)
    assert sandbox.files.read("/workspace/notes/a.txt") == "hello"
    assert sandbox.files.read("notes/a.txt", format="bytes") == bytearray(b"hello")
    assert sandbox.commands.run("cat notes/a.txt").stdout == "hello"
    data = bytes(range(256)) * 4096
    sandbox.files.write("blob.bin", data)
    assert bytes(sandbox.files.read("blob.bin", format="bytes")) == data
    many = sandbox.files.write_files([{"path": "m/1.txt", "data": "one"}, {"path": "m/2.txt", "data": "two"}])
    assert sorted(i.path for i in many) == ["/workspace/m/1.txt", "/workspace/m/2.txt"]


def test_entries_are_listed_described_made_renamed_and_removed(sandbox):
    sandbox.files.write("d/a.txt", "12345")
    assert sandbox.files.make_dir("d/sub") is True
    assert sandbox.files.make_dir("d/sub") is False, "there already"
    assert sorted((e.name, e.type) for e in sandbox.files.list("d")) == [("a.txt", FileType.FILE), ("sub", FileType.DIR)]
    info = sandbox.files.get_info("d/a.txt")
    assert (info.size, info.path, info.permissions) == (5, "/workspace/d/a.txt", "-rw-r--r--")
    assert sandbox.files.exists("d/a.txt") and not sandbox.files.exists("d/nope")
    moved = sandbox.files.rename("d/a.txt", "d/sub/b.txt")
    assert moved.path == "/workspace/d/sub/b.txt"
    assert [e.path for e in sandbox.files.list("d", depth=2)] == ["/workspace/d/sub", "/workspace/d/sub/b.txt"]
    sandbox.files.remove("d")
    assert not sandbox.files.exists("d")
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("d/sub/b.txt")


def test_paths_outside_the_workspace_are_refused_naming_them(sandbox):
    with pytest.raises(InvalidArgumentException, match="outside the workspace"):
        sandbox.files.write("/home/user/a.txt", "x")
    with pytest.raises(InvalidArgumentException, match=r"climbs out|outside"):
        sandbox.files.read("../../etc/passwd")
    with pytest.raises(SandboxException, match="outside the workspace"):
        sandbox.files.list("/etc")
    with pytest.raises(Exception, match="user"):
        sandbox.files.read("a.txt", user="root")


def test_files_take_only_the_sandboxs_access_token_and_a_sandbox_gone_is_not_running(gateway, sandbox):
    url, headers = f"{gateway.url}/files", {"E2b-Sandbox-Id": sandbox.sandbox_id}
    assert httpx.get(url, params={"path": "a.txt"}, headers={**headers, "X-Access-Token": "x"}).status_code == 401
    assert httpx.get(url, params={"path": "a.txt"}, headers=headers).status_code == 401
    sandbox.files.write("a.txt", "x")
    Sandbox.kill(sandbox.sandbox_id)
    with pytest.raises(SandboxException, match="not running|not found"):
        sandbox.files.read("a.txt")
