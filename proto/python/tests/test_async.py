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
        assert sorted(s.name for s in await client.list()) == ["a0", "a1"]
