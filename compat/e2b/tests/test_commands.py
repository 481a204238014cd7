"""E2B's commands through the unmodified SDK: foreground with output and exit codes, streaming
callbacks, background processes listed, connected to, fed stdin and killed, timeouts; each a
Berth exec, so it runs once and always ends."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import CommandExitException, Sandbox, TimeoutException
from e2b.exceptions import AuthenticationException


@pytest.fixture
def sandbox(gateway):
    s = Sandbox.create(timeout=300, envs={"GREETING": "hello"})
    yield s
    s.kill()


def test_a_foreground_command_returns_its_output_and_exit_code(sandbox):
    result = sandbox.commands.run("echo out; echo err >&2; echo $GREETING $EXTRA; pwd", envs={"EXTRA": "x"}, cwd="/tmp")
    assert (result.exit_code, result.stderr) == (0, "err\n")
    assert result.stdout == "out\nhello x\n/tmp\n"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert (failed.value.exit_code, failed.value.stdout) == (3, "partial\n")


def test_output_streams_to_callbacks_as_it_is_written(sandbox):
    lines: list[str] = []
    sandbox.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=lines.append)
    assert "".join(lines) == "line1\nline2\nline3\n"


def test_a_background_process_is_listed_fed_stdin_and_ends_with_its_input(sandbox):
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    assert handle.pid in [p.pid for p in sandbox.commands.list()]
    sandbox.commands.send_stdin(handle.pid, "abc\n")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert (result.exit_code, result.stdout) == (0, "abc\n")
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]


def until(check, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "never came true"
        time.sleep(0.05)


def test_a_process_is_connected_to_from_its_first_byte_and_killed(sandbox):
    handle = sandbox.commands.run("echo started; touch started.mark; sleep 60", background=True)
    # A sync handle reads its output only as it is waited on: the mark says it got that far.
    until(lambda: sandbox.commands.run("test -e started.mark || echo no").stdout == "")
    again = sandbox.commands.connect(handle.pid)
    assert again.pid == handle.pid
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as killed:
        again.wait()
    assert killed.value.stdout == "started\n"
    assert sandbox.commands.kill(handle.pid) is False, "an ended process is not killed again"
    assert sandbox.commands.kill(999_999) is False


def test_a_command_past_its_timeout_is_killed_and_raises_timeout(sandbox):
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    until(lambda: sandbox.commands.list() == [])


def test_the_in_sandbox_api_takes_only_the_sandboxs_access_token(gateway, sandbox):
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "Content-Type": "application/json"}
    wrong = httpx.post(f"{gateway.url}/process.Process/List", json={}, headers={**headers, "X-Access-Token": "x"})
    assert (wrong.status_code, wrong.json()["code"]) == (401, "unauthenticated")
    missing = httpx.post(f"{gateway.url}/process.Process/List", json={}, headers=headers)
    assert missing.status_code == 401
    with pytest.raises(Exception) as refused:
        sandbox.commands.run("true", user="root")
    assert "user" in str(refused.value)
    assert not isinstance(refused.value, AuthenticationException)


def test_a_pty_session_takes_input_is_resized_and_ends_with_its_shell(sandbox):
    from e2b import PtySize

    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(terminal.pid, b"stty size; echo pty-$((40+2)); exit 7\n")
    seen = bytearray()
    with pytest.raises(CommandExitException) as ended:
        terminal.wait(on_pty=seen.extend)
    assert ended.value.exit_code == 7
    assert b"40 120" in seen and b"pty-42" in seen, bytes(seen)
