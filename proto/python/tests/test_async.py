"""The asyncio client: the same calls, concurrently."""

from __future__ import annotations

import asyncio

import pytest

import berth
from berth.aio import AsyncClient


async def test_the_async_client_drives_sandboxes_and_execs_concurrently(gateway):
    async with AsyncClient(data_dir=gateway.data_dir) as client:
        assert (await client.info())["store"] == "sqlite"
        boxes = await asyncio.gather(*(client.create(f"a{i}", ["sleep", "3600"]) for i in range(3)))
        assert [b.phase for b in boxes] == ["Ready"] * 3
        results = await asyncio.gather(*(client.exec(f"a{i}", ["sh", "-c", f"echo {i}; exit {i}"]) for i in range(3)))
        assert [(r.stdout, r.exit_code) for r in results] == [(b"0\n", 0), (b"1\n", 1), (b"2\n", 2)]
        chunks = [c async for c in client.exec_stream("a0", ["sh", "-c", "echo x; echo y >&2"])]
        assert sorted(c.stream for c in chunks) == ["stderr", "stdout"]
        assert (await client.stop("a1")).phase == "Stopped"
        await client.delete("a2")
        with pytest.raises(berth.NotFound):
            await client.get("a2")
        listing = await client.list_at()
        assert sorted(s.name for s in listing.sandboxes) == ["a0", "a1"]
        # The fleet watch from the listing's cursor: what came after it, and nothing before.
        await client.start("a1")
        changes = []
        async for change in client.watch_all(cursor=listing.cursor, timeout=30):
            changes.append(change)
            if change.sandbox is not None and change.sandbox.phase == "Ready":
                break
        assert changes[0].is_bookmark and {c.name for c in changes[1:]} == {"a1"}


async def test_the_async_client_snapshots_forks_and_makes_sandboxes_from_snapshots(gateway):
    read_f = ["sh", "-c", "until [ -s f ]; do sleep 0.05; done; cat f"]
    async with AsyncClient(data_dir=gateway.data_dir) as client:
        await client.create("src", ["sh", "-c", "[ -f f ] || echo one > f; sleep 3600"])
        assert (await client.exec("src", read_f)).stdout == b"one\n"
        # Two copies of one running sandbox at once: each is its own consistent point.
        snap, forks = await asyncio.gather(
            client.create_snapshot("snap", "src"), client.fork("src", 2, names=["x", "y"], labels={"team": "b"})
        )
        assert snap.phase == "Ready" and len(snap.sha256) == 64 and snap.size_bytes > 0
        assert [(f.name, f.phase, f.labels["berth.fork-of"], f.labels["team"]) for f in forks] == [
            ("x", "Ready", "src", "b"),
            ("y", "Ready", "src", "b"),
        ]
        await client.exec("src", ["sh", "-c", "echo two > f"])
        made = await client.create_from_snapshot("copy", "snap")
        assert made.from_snapshot == "snap"
        outputs = await asyncio.gather(*(client.exec(n, read_f) for n in ("copy", "x", "y", "src")))
        assert [r.stdout for r in outputs] == [b"one\n", b"one\n", b"one\n", b"two\n"]
        assert (await client.get_snapshot("snap")).users == ["copy"]
        listed = {s.name: s for s in await client.list_snapshots()}
        assert listed.pop("snap").users == ["copy"]
        # The fork's, if it has not gone yet (it goes once every fork has its files).
        assert all(s.fork_of == "src" for s in listed.values()), listed
        assert await client.delete_snapshot("snap") is None
        with pytest.raises(berth.NotFound):
            await client.get_snapshot("snap")
        with pytest.raises(berth.NotFound):
            await client.create_snapshot("other", "nowhere")
        await client.create_snapshot("again", "src")
        with pytest.raises(berth.AlreadyExists):
            await client.create_snapshot("again", "src")


async def test_the_async_client_keeps_volumes_and_gives_port_urls(gateway):
    async with AsyncClient(data_dir=gateway.data_dir) as client:
        await client.create_volume("cache")
        await client.create("user", ["sleep", "3600"], volumes=[berth.Mount("cache", "/cache")], public_ports=[8000])
        assert (await client.get_volume("cache")).users == ["user"]
        url = await client.port_url("user", 8000)
        assert url.public and url.token == "" and url.url.endswith("/sandboxes/user/ports/8000/")
        await client.delete("user")
        assert await client.delete_volume("cache") is None
        assert await client.list_volumes() == []


async def test_the_async_client_moves_files_reads_logs_renews_and_claims(gateway, tmp_path):
    async with AsyncClient(data_dir=gateway.data_dir) as client:
        await client.create("box", ["sh", "-c", "echo hi; exec sleep 3600"], ttl=60)
        await client.write_file("box", "a/b.txt", "async")
        assert await client.read_file("box", "a/b.txt") == b"async"
        assert "a/b.txt" in await client.download("box", "a", tmp_path)
        assert (tmp_path / "a" / "b.txt").read_text() == "async"
        assert b"".join([c.data async for c in client.logs("box")]) == b"hi\n"
        assert (await client.renew("box", ttl=3600)).deadline is not None
        with pytest.raises(berth.ExecTimeout):
            await client.exec("box", ["sleep", "30"], timeout=1)
        await client.create_template("warm", ["sleep", "3600"], min_ready=1)
        claimed = await client.claim("warm", wait=60)
        assert claimed.phase == "Ready"
        assert [t.name for t in await client.list_templates()] == ["warm"]
        await client.delete_template("warm")
        await client.delete(claimed.name)
