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
