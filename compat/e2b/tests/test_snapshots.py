"""E2B's snapshots and forks through the unmodified SDK: a snapshot of a sandbox's files, listed,
a sandbox made from it, and forks, each with the files the source had."""

from __future__ import annotations

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException


def test_a_snapshot_makes_sandboxes_with_its_files_and_a_fork_makes_several(gateway):
    source = Sandbox.create(timeout=300)
    source.files.write("state.txt", "v1")
    snapshot = source.create_snapshot(mode="filesystem")
    listed = Sandbox.list_snapshots(sandbox_id=source.sandbox_id)
    found = []
    while listed.has_next:
        found.extend(s.snapshot_id for s in listed.next_items())
    assert found == [snapshot.snapshot_id]
    # The source goes on as it was; a sandbox made from the snapshot has its files.
    source.files.write("state.txt", "v2")
    made = Sandbox.create(snapshot.snapshot_id, timeout=120, metadata={"from": "snapshot"})
    assert made.files.read("state.txt") == "v1"
    assert made.get_info().metadata == {"from": "snapshot"}
    forks = source.fork(count=2, timeout=120)
    assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
    assert [f.files.read("state.txt") for f in forks] == ["v2", "v2"]
    assert len({f.sandbox_id for f in forks} | {source.sandbox_id, made.sandbox_id}) == 4
    for s in [*forks, made, source]:
        s.kill()


def test_a_snapshot_of_memory_is_refused_saying_so(gateway):
    source = Sandbox.create(timeout=120)
    with pytest.raises(SandboxException, match="files, not its memory"):
        source.create_snapshot(mode="full")
    source.kill()
