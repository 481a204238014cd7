"""E2B's API on a Berth of two nodes: the SDK speaks to one gateway, and a sandbox the other
node runs is reached all the same, each in-sandbox call (commands, stdin, kill, files) carried to
the node that runs it."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from e2b import CommandExitException, Sandbox


def test_a_sandbox_another_node_runs_is_reached_through_the_gateway_the_sdk_speaks_to(two_nodes):
    n1, n2 = two_nodes
    # n1 is given nothing new: the sandbox made through its gateway runs on n2.
    n1.cli("node", "drain", "n1")
    sandbox = Sandbox.create(timeout=300)
    placed = json.loads(n1.cli("-o", "json", "sandbox", "get", sandbox.sandbox_id))
    assert placed["node"] == "n2", placed

    result = sandbox.commands.run("echo out; echo err >&2; hostname >/dev/null")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\n", "err\n")
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert (failed.value.exit_code, failed.value.stdout) == (3, "partial\n")

    fed = sandbox.commands.run("cat", background=True, stdin=True)
    assert fed.pid in [p.pid for p in sandbox.commands.list()]
    sandbox.commands.send_stdin(fed.pid, "abc\n")
    sandbox.commands.close_stdin(fed.pid)
    assert fed.wait().stdout == "abc\n"
    sleeper = sandbox.commands.run("sleep 60", background=True)
    assert sandbox.commands.kill(sleeper.pid) is True
    deadline = time.monotonic() + 20
    while sleeper.pid in [p.pid for p in sandbox.commands.list()]:
        assert time.monotonic() < deadline, "the killed process is still listed"
        time.sleep(0.05)

    sandbox.files.write("notes/a.txt", "written through n1's gateway")
    assert sandbox.files.read("notes/a.txt") == "written through n1's gateway"
    assert [e.name for e in sandbox.files.list("notes")] == ["a.txt"]
    # On n2's host, in the sandbox's workspace, and nothing of it on n1's.
    kept = n2.data_dir / "sandboxes" / placed["id"] / "workspace" / "notes" / "a.txt"
    assert kept.read_text() == "written through n1's gateway"
    assert not (n1.data_dir / "sandboxes" / placed["id"]).exists()

    # The gateway the SDK speaks to checks the access token before it carries anything; a call
    # claiming to be carried, with another API token, is refused where it lands.
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id}
    wrong = httpx.post(f"{n1.url}/process.Process/List", json={}, headers={**headers, "X-Access-Token": "x"})
    assert (wrong.status_code, wrong.json()["code"]) == (401, "unauthenticated")
    forged = {**headers, "Berth-Carried": "not-the-token", "Berth-Generation": str(placed["generation"])}
    for gateway in (n1, n2):
        refused = httpx.post(f"{gateway.url}/process.Process/List", json={}, headers=forged)
        assert (refused.status_code, refused.json()["code"]) == (401, "unauthenticated"), refused.text
    sandbox.kill()
