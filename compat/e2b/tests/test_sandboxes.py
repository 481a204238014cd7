"""E2B's documented sandbox flows, through the unmodified `e2b` SDK, against a Berth gateway:
create, list, get_info, set_timeout, pause and connect (resume), kill; and what Berth does not
serve, answered with the SDK's own exception types."""

from __future__ import annotations

import time

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException


def listed(**query) -> list:
    paginator = Sandbox.list(query=SandboxQuery(**query) if query else None)
    items = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


def test_a_sandbox_is_created_ready_listed_described_and_killed(gateway):
    sandbox = Sandbox.create(timeout=120, metadata={"team": "a", "run": "r1"}, envs={"GREETING": "hi"})
    info = sandbox.get_info()
    assert (info.sandbox_id, info.template_id, info.state) == (sandbox.sandbox_id, "base", SandboxState.RUNNING)
    assert info.metadata == {"team": "a", "run": "r1"}
    lifetime = (info.end_at - info.started_at).total_seconds()
    assert 115 <= lifetime <= 125, lifetime
    assert [s.sandbox_id for s in listed()] == [sandbox.sandbox_id]
    assert [s.sandbox_id for s in listed(metadata={"team": "a"})] == [sandbox.sandbox_id]
    assert listed(metadata={"team": "b"}) == []
    assert listed(state=[SandboxState.PAUSED]) == []
    assert sandbox.kill() is True
    assert listed() == []
    # Killed, it is gone: a second kill says so, and a connect is NotFound.
    assert Sandbox.kill(sandbox.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandbox.sandbox_id)


def test_set_timeout_renews_the_lifetime_from_now(gateway):
    sandbox = Sandbox.create(timeout=60)
    sandbox.set_timeout(3600)
    info = sandbox.get_info()
    assert (info.end_at - info.started_at).total_seconds() >= 3500
    sandbox.kill()


def test_a_paused_sandbox_is_listed_paused_and_a_connect_resumes_it(gateway):
    sandbox = Sandbox.create(timeout=300)
    assert sandbox.is_running() is True
    assert sandbox.pause() is True
    assert sandbox.get_info().state == SandboxState.PAUSED
    assert sandbox.is_running() is False
    # Kept while paused, as E2B keeps a paused sandbox: its timeout no longer ends it.
    assert (sandbox.get_info().end_at - sandbox.get_info().started_at).total_seconds() > 86_400
    assert [s.sandbox_id for s in listed(state=[SandboxState.PAUSED])] == [sandbox.sandbox_id]
    # Paused already: E2B answers 409, which the SDK takes as False.
    assert sandbox.pause() is False
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=600)
    assert resumed.sandbox_id == sandbox.sandbox_id
    info = resumed.get_info()
    assert info.state == SandboxState.RUNNING
    assert (info.end_at - info.started_at).total_seconds() >= 590
    assert resumed.commands.run("echo back").stdout == "back\n"
    resumed.kill()
    assert resumed.is_running() is False


def test_a_sandbox_paused_at_its_timeout_is_resumed_by_a_connect(gateway):
    sandbox = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    assert sandbox.get_info().lifecycle["on_timeout"] == "pause"
    deadline = time.monotonic() + 30
    while sandbox.get_info().state != SandboxState.PAUSED:
        assert time.monotonic() < deadline, "not paused at its timeout"
        time.sleep(0.2)
    # Past its deadline: the connect renews it (E2B's default, 300 s) before it resumes it.
    resumed = Sandbox.connect(sandbox.sandbox_id)
    info = resumed.get_info()
    assert info.state == SandboxState.RUNNING
    assert info.end_at.timestamp() - time.time() > 250
    resumed.kill()


def test_bad_input_and_what_berth_does_not_serve_raise_the_sdks_own_errors(gateway, monkeypatch):
    with pytest.raises(SandboxException, match="template 'no-such-template' not found"):
        Sandbox.create(template="no-such-template")
    with pytest.raises(SandboxException, match=r"metadata|labels"):
        Sandbox.create(metadata={"not a key": "x"})
    with pytest.raises(SandboxException, match="does not support network"):
        Sandbox.create(network={"deny_out": ["0.0.0.0/0"]})
    assert listed() == [], "nothing half-made is left"
    with pytest.raises(NotFoundException):
        Sandbox.get_info("sb-0000000000000000")
    monkeypatch.setenv("E2B_API_KEY", "not-the-token")
    with pytest.raises(AuthenticationException):
        Sandbox.create()


def test_a_sandbox_ends_at_its_timeout(gateway):
    sandbox = Sandbox.create(timeout=2)
    deadline = time.monotonic() + 30
    while listed():
        assert time.monotonic() < deadline, "still there after its timeout"
        time.sleep(0.2)
    assert Sandbox.kill(sandbox.sandbox_id) is False


def test_a_pause_and_a_connect_keep_files_and_running_processes(gateway):
    sandbox = Sandbox.create(timeout=300)
    sandbox.files.write("kept.txt", "still here")
    handle = sandbox.commands.run("sleep 600", background=True)
    assert sandbox.pause() is True
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert resumed.files.read("kept.txt") == "still here"
    assert handle.pid in [p.pid for p in resumed.commands.list()]
    assert resumed.commands.kill(handle.pid) is True
    resumed.kill()
