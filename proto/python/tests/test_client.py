"""The sync client against a real gateway: lifecycle, waiting, providers, execs (output, stdin,
exit codes, timeouts, an id retried through a gateway restart), snapshots and forks (files copied
byte for byte), volumes, preview URLs, and every refusal as its `BerthError`."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

import berth

from conftest import free_port

SLEEP = ["sleep", "3600"]
#: Writes `f` in its workspace once: a sandbox made from a snapshot of it runs this again, over
#: the copied files, and must keep what it finds.
KEEPS_A_FILE = ["sh", "-c", "[ -f f ] || echo one > f; sleep 3600"]
#: `f` once the command has written it (Ready comes as the command starts, maybe before).
READ_F = ["sh", "-c", "until [ -s f ]; do sleep 0.05; done; cat f"]


def test_a_sandbox_goes_through_its_lifecycle(client):
    box = client.create("web", SLEEP, labels={"team": "a"})
    assert (box.phase, box.intent, box.generation) == ("Ready", "Running", 1)
    assert client.get("web").labels == {"team": "a"}
    assert [s.name for s in client.list({"team": "a"})] == ["web"]
    assert client.list({"team": "b"}) == []
    stopped = client.stop("web")
    assert (stopped.phase, stopped.intent) == ("Stopped", "Stopped")
    started = client.start("web")
    assert (started.phase, started.generation) == ("Ready", 2)
    client.delete("web")
    with pytest.raises(berth.NotFound) as missing:
        client.get("web")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert "web" in missing.value.message


def test_a_paused_sandbox_runs_nothing_until_it_is_resumed(client):
    client.create("held", ["sh", "-c", "i=0; while true; do i=$((i + 1)); echo $i > ticks; sleep 0.05; done"])
    # A run outside a container is never checkpointed: refused, saying why, and nothing changes.
    with pytest.raises(berth.FailedPrecondition) as refused:
        client.pause("held", checkpoint=True)
    assert "the process driver cannot checkpoint here" in refused.value.message
    assert client.get("held").intent == "Running"
    with pytest.raises(ValueError, match="only a pause checkpoints"):
        berth._wire.lifecycle_request("stop", "held", None, checkpoint=True)
    paused = client.pause("held")
    assert not paused.checkpoint
    assert (paused.phase, paused.intent, paused.generation) == ("Paused", "Paused", 1)
    with pytest.raises(berth.FailedPrecondition) as refused:
        client.exec("held", ["cat", "ticks"])
    assert "Paused" in refused.value.message
    resumed = client.resume("held")
    assert (resumed.phase, resumed.intent, resumed.generation) == ("Ready", "Running", 1)
    first = int(client.exec("held", ["cat", "ticks"]).stdout)
    time.sleep(0.3)
    assert int(client.exec("held", ["cat", "ticks"]).stdout) > first, "the same run goes on counting"
    client.stop("held")
    with pytest.raises(berth.FailedPrecondition):
        client.pause("held")
    client.delete("held")


def test_a_watch_sees_each_phase_and_the_removal(client):
    client.create("w", SLEEP)
    seen = []

    def follow():
        for s in client.watch("w", timeout=30):
            seen.append(None if s is None else s.phase)
            if s is None:
                return

    watcher = threading.Thread(target=follow)
    watcher.start()
    time.sleep(0.5)
    client.delete("w")
    watcher.join(30)
    assert seen[0] == "Ready" and seen[-1] is None and "Deleting" in seen, seen


def test_the_fleet_watch_resumes_from_its_last_cursor_missing_nothing_and_repeating_nothing(client):
    client.create("listed", SLEEP, labels={"team": "a"})
    client.create("elsewhere", SLEEP, labels={"team": "b"})
    listing = client.list_at({"team": "a"})
    assert [s.name for s in listing.sandboxes] == ["listed"]
    seen = []
    client.create("new", SLEEP, labels={"team": "a"})
    for change in client.watch_all({"team": "a"}, listing.cursor, timeout=30):
        seen.append(change)
        if change.sandbox is not None and change.name == "new" and change.sandbox.phase == "Ready":
            break
    assert seen[0].is_bookmark and seen[0].cursor == listing.cursor
    client.delete("new")
    for change in client.watch_all({"team": "a"}, seen[-1].cursor, timeout=30):
        assert change.is_bookmark or change.cursor != seen[-1].cursor
        seen.append(change)
        if change.removed:
            break
    changes = [c for c in seen if not c.is_bookmark]
    assert {c.name for c in changes} == {"new"}, "the selector holds, and the listed sandbox did not change"
    versions = [c.sandbox.resource_version for c in changes if c.sandbox is not None]
    assert versions == list(range(1, len(versions) + 1)), "every version once, in order"
    assert changes[-1].removed and changes[-1].sandbox is None
    with pytest.raises(berth.InvalidArgument) as bad:
        next(client.watch_all(cursor="nonsense", timeout=5))
    assert "cursor" in bad.value.message


def test_every_refusal_is_its_error_with_the_servers_message(client, gateway):
    with pytest.raises(berth.InvalidArgument) as bad:
        client.create("Not_A_Name", SLEEP, wait=False)
    assert "name" in bad.value.message
    client.create("once", SLEEP)
    with pytest.raises(berth.AlreadyExists):
        client.create("once", SLEEP)
    stale = client.get("once").resource_version + 5
    with pytest.raises(berth.Aborted):
        client.stop("once", expected_version=stale)
    assert client.get("once").phase == "Ready", "a refused stop wrote nothing"
    with pytest.raises(berth.InvalidArgument) as ttl:
        client.create("bad-ttl", SLEEP, ttl=0, wait=False)
    assert "spec.lifetime.ttl_ms" in ttl.value.message
    with pytest.raises(ValueError):
        client.create("bad-policy", SLEEP, restart="sometimes")
    with berth.Client(data_dir=gateway.data_dir, token="not-the-gateways-token-000") as wrong:
        with pytest.raises(berth.Unauthenticated):
            wrong.list()


def test_a_failing_command_and_a_slow_wait_raise(client):
    with pytest.raises(berth.SandboxFailed) as failed:
        client.create("broken", ["/no/such/program"])
    assert "broken" in str(failed.value)
    client.create("slow", ["sh", "-c", "trap '' TERM; sleep 3600"])
    with pytest.raises(berth.WaitTimeout):
        client.stop("slow", timeout=1)
    assert client.wait_for("slow", "Stopped", timeout=30).phase == "Stopped"


def test_limits_are_kept_and_a_run_killed_for_memory_says_so(client):
    limited = client.create("limited", SLEEP, cpus=0.5, memory=64 << 20, pids=100)
    assert (limited.cpus, limited.memory, limited.pids) == (0.5, 64 << 20, 100)
    assert client.get("limited").memory == 64 << 20
    assert client.create("unlimited", SLEEP).memory is None
    with pytest.raises(berth.InvalidArgument) as negative:
        client.create("negative", SLEEP, memory=-1, wait=False)
    assert "spec.limits.memory_bytes" in negative.value.message
    # Ready first or not (the supervisor may connect before the kill), it ends in Error.
    client.create("hog", ["sh", "-c", "dd if=/dev/zero of=/dev/null bs=256M count=1"], memory=32 << 20, wait=False)
    failed = client.wait_for("hog", "Error", timeout=60)
    assert failed.failure.reason == "OutOfMemory", failed.failure
    assert str(32 << 20) in failed.failure.message


def test_egress_entries_are_checked_and_the_process_driver_refuses_a_list(client):
    provider = client.create_provider("api", "http", {"API_KEY": "k"}, endpoints=["api.test", "10.0.0.0/8"])
    assert provider.endpoints == ["api.test", "10.0.0.0/8"]
    assert client.get_provider("api").endpoints == ["api.test", "10.0.0.0/8"]
    with pytest.raises(berth.InvalidArgument) as bad:
        client.create_provider("bad", "http", {}, endpoints=["ok.test", "not a host"])
    assert "endpoints[1]" in bad.value.message
    with pytest.raises(berth.InvalidArgument) as malformed:
        client.create("malformed", SLEEP, allow=["10.0.0.0/99"], wait=False)
    assert "spec.egress.allow[0]" in malformed.value.message
    # The tests' gateway runs the process driver, which shares the host's network.
    with pytest.raises(berth.FailedPrecondition) as refused:
        client.create("listed", SLEEP, allow=["api.test"], wait=False)
    assert "spec.egress.allow" in refused.value.message
    plain = client.create("plain", SLEEP, providers=["api"])
    assert (plain.allow, plain.egress_providers) == ([], ["api"])


def test_providers_reach_execs_and_guard_their_users(client):
    provider = client.create_provider("llm", "api", {"API_KEY": "s3cret"})
    assert provider.credential_names == ["API_KEY"]
    assert [p.name for p in client.list_providers()] == ["llm"]
    client.create("agent", SLEEP, providers=["llm"])
    assert client.exec("agent", ["sh", "-c", "echo $API_KEY"]).stdout == b"s3cret\n"
    with pytest.raises(berth.FailedPrecondition):
        client.delete_provider("llm")
    assert client.detach_provider("agent", "llm").providers == []
    client.delete_provider("llm")
    with pytest.raises(berth.NotFound):
        client.get_provider("llm")


def test_execs_give_output_exit_codes_stdin_and_timeouts(client):
    client.create("box", SLEEP)
    result = client.exec("box", ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (result.stdout, result.stderr, result.exit_code, result.state) == (b"out\n", b"err\n", 7, "Exited")
    assert client.exec("box", ["wc", "-c"], stdin=b"hello").stdout.strip() == b"5"
    assert client.exec("box", ["sh", "-c", "echo $GREETING; pwd"], env={"GREETING": "hi"}, cwd="/tmp").stdout == b"hi\n/tmp\n"
    with pytest.raises(berth.ExecTimeout) as late:
        client.exec("box", ["sleep", "10"], timeout=0.5)
    assert late.value.result.state == "TimedOut"
    chunks = list(client.exec_stream("box", ["sh", "-c", "echo a; sleep 0.2; echo b"]))
    assert b"".join(c.data for c in chunks) == b"a\nb\n"
    assert [c.offset for c in chunks][0] == 0
    with pytest.raises(berth.InvalidArgument) as bad:
        client.exec("box", [])
    assert "argv" in bad.value.message
    client.stop("box")
    with pytest.raises(berth.FailedPrecondition):
        client.exec("box", ["true"])


def test_an_exec_id_runs_once_and_its_stream_survives_a_gateway_restart(client, gateway):
    client.create("job", SLEEP)
    count = ["sh", "-c", "echo run >> runs; wc -l < runs"]
    first = client.exec("job", count, exec_id="count-1")
    again = client.exec("job", count, exec_id="count-1")
    assert first.stdout == again.stdout == b"1\n", "the retry attached to the first run"
    assert client.get_exec("job", "count-1").exit_code == 0
    with pytest.raises(berth.AlreadyExists):
        client.exec("job", ["true"], exec_id="count-1")

    # The gateway dies mid-stream; the stream is opened again with the exec's id.
    slow = ["sh", "-c", "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done"]
    collector = berth._wire.Collector()
    stream = client.exec_stream("job", slow, exec_id="slow-1", collector=collector)
    first_chunk = next(stream)
    assert first_chunk.data.startswith(b"line 1")
    gateway.restart()
    rest = b"".join(c.data for c in stream)
    assert first_chunk.data + rest == b"".join(b"line %d\n" % i for i in range(1, 7))
    assert collector.end.exit_code == 0
    assert client.exec("job", ["sh", "-c", "wc -l < runs"]).stdout == b"1\n", "no exec ran twice"


def test_a_snapshot_keeps_the_files_a_sandbox_made_from_it_starts_with(client):
    client.create("src", KEEPS_A_FILE, labels={"team": "a"})
    assert client.exec("src", READ_F).stdout == b"one\n"
    snap = client.create_snapshot("snap", "src")
    assert (snap.phase, snap.source, snap.source_generation, snap.error) == ("Ready", "src", 1, None)
    assert re.fullmatch("[0-9a-f]{64}", snap.sha256) and snap.size_bytes > 0
    assert (snap.users, snap.fork_of, snap.image) == ([], None, None), "the process driver commits no image"
    assert client.get("src").phase == "Ready", "a Ready source is frozen only for the copy"
    client.exec("src", ["sh", "-c", "echo two > f"])

    made = client.create_from_snapshot("copy", "snap", labels={"role": "copy"})
    assert (made.phase, made.from_snapshot, made.command) == ("Ready", "snap", KEEPS_A_FILE)
    assert made.labels["team"] == "a" and made.labels["role"] == "copy", made.labels
    assert client.exec("copy", READ_F).stdout == b"one\n", "the files as they were at the copy"
    assert client.exec("src", READ_F).stdout == b"two\n", "the source's own files go on"
    assert client.get("copy").from_snapshot == "snap"
    assert client.get_snapshot("snap").users == ["copy"]
    assert [(s.name, s.users, s.sha256) for s in client.list_snapshots()] == [("snap", ["copy"], snap.sha256)]

    assert client.delete_snapshot("snap") is None
    with pytest.raises(berth.NotFound) as gone:
        client.get_snapshot("snap")
    assert "snap" in gone.value.message
    assert client.list_snapshots() == []
    assert client.exec("copy", READ_F).stdout == b"one\n", "a sandbox made from it keeps its files"


def test_a_fork_makes_sandboxes_from_one_point_of_a_running_sandbox(client):
    client.create("src", KEEPS_A_FILE)
    client.exec("src", READ_F)
    client.exec("src", ["sh", "-c", "echo two > f"])
    forks = client.fork("src", count=2, labels={"team": "b"})
    assert [(f.name, f.phase) for f in forks] == [("src-1", "Ready"), ("src-2", "Ready")]
    taken = {f.labels["berth.snapshot"] for f in forks}
    assert len(taken) == 1, "one point for all of them"
    for f in forks:
        assert (f.labels["berth.fork-of"], f.labels["team"], f.from_snapshot) == ("src", "b", *taken)
        assert client.exec(f.name, READ_F).stdout == b"two\n"
    assert client.get("src").phase == "Ready", "the source runs on"
    # The snapshot the fork took goes by itself once every fork has its files (a sweep's work:
    # here every 0.5 s), so it is looked at only while it is there.
    deadline = time.monotonic() + 30
    while True:
        left = [s for s in client.list_snapshots() if s.name in taken]
        if not left:
            break
        assert (left[0].fork_of, left[0].source, sorted(left[0].users)) == ("src", "src", ["src-1", "src-2"])
        assert time.monotonic() < deadline, "the fork's snapshot stayed"
        time.sleep(0.1)
    assert [f.name for f in client.fork("src", wait=False)] == ["src-3"], "the lowest number free"
    with pytest.raises(berth.InvalidArgument) as miscounted:
        client.fork("src", 2, names=["only-one"])
    assert "names" in miscounted.value.message


def test_snapshot_refusals_are_their_errors(client):
    with pytest.raises(berth.NotFound) as missing:
        client.create_snapshot("snap", "nowhere")
    assert "nowhere" in missing.value.message
    client.create("src", KEEPS_A_FILE)
    taking = client.create_snapshot("snap", "src", wait=False)
    assert taking.phase == "Creating"
    with pytest.raises(berth.AlreadyExists) as taken:
        client.create_snapshot("snap", "src")
    assert "snap" in taken.value.message
    with pytest.raises(berth.NotFound):
        client.create_from_snapshot("copy", "no-such-snapshot")
    with pytest.raises(berth.NotFound):
        client.fork("nowhere")
    with pytest.raises(berth.NotFound):
        client.delete_snapshot("no-such-snapshot")
    stale = client.get_snapshot("snap").resource_version + 5
    with pytest.raises(berth.Aborted):
        client.delete_snapshot("snap", expected_version=stale)
    assert client.delete_snapshot("snap", wait=False).phase == "Deleting"


def test_a_volume_outlives_its_sandboxes_and_its_delete_waits_for_none_being_deleted(client):
    volume = client.create_volume("data")
    assert (volume.phase, volume.users) == ("Ready", [])
    # The process driver's runs find a volume as a link under $BERTH_MOUNTS.
    mount = [berth.Mount("data", "/data")]
    client.create("writer", ["sh", "-c", 'echo kept > "$BERTH_MOUNTS/data/f"; sleep 3600'], volumes=mount)
    client.create("reader", SLEEP, volumes=[berth.Mount("data", "/data", read_only=True)])
    read = ["sh", "-c", 'until [ -s "$BERTH_MOUNTS/data/f" ]; do sleep 0.05; done; cat "$BERTH_MOUNTS/data/f"']
    assert client.exec("reader", read).stdout == b"kept\n"
    assert sorted(client.get_volume("data").users) == ["reader", "writer"]
    assert [v.name for v in client.list_volumes()] == ["data"]
    with pytest.raises(berth.FailedPrecondition) as refused:
        client.delete_volume("data")
    assert "reader" in refused.value.message and "writer" in refused.value.message
    client.delete("writer")
    client.delete("reader")
    assert client.delete_volume("data") is None
    with pytest.raises(berth.NotFound):
        client.get_volume("data")


def _fetch(url: str, headers=None):
    """The status and body of a GET, through no proxy of the environment's."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def _served(url: str):
    """The body once the run's server answers through the proxy."""
    for _ in range(200):
        status, body = _fetch(url)
        if status == 200:
            return body
        time.sleep(0.05)
    raise AssertionError(f"{url} never served: {_fetch(url)}")


def test_a_port_url_reaches_its_run_and_never_the_next(client):
    port = free_port()
    client.create("web", ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"])
    url = client.port_url("web", port)
    assert (url.generation, url.public, url.sandbox_id) == (1, False, client.get("web").id)
    assert url.token and url.url.endswith(f"/sandboxes/web/ports/{port}/?berth_token={url.token}")
    assert b"Directory listing" in _served(url.url)
    bare = url.url.split("?")[0]
    assert _fetch(bare)[0] == 401
    assert _fetch(bare, {"x-berth-port-token": url.token})[0] == 200
    client.stop("web")
    assert _fetch(url.url)[0] == 409
    with pytest.raises(berth.FailedPrecondition):
        client.port_url("web", port)
    client.start("web")
    status, body = _fetch(url.url)
    assert status == 410 and b"run 1" in body, body
    fresh = client.port_url("web", port)
    assert fresh.generation == 2
    assert b"Directory listing" in _served(fresh.url)


def test_files_go_in_and_out_of_the_workspace(client, tmp_path):
    client.create("files", SLEEP)
    client.write_file("files", "notes/a.txt", "hello")
    assert client.read_file("files", "notes/a.txt") == b"hello"
    assert client.exec("files", ["cat", "notes/a.txt"]).stdout == b"hello"
    client.write_file("files", "/workspace/notes/a.txt", b"\x00over\xff")
    assert client.read_file("files", "notes/a.txt") == b"\x00over\xff"
    # A local directory in, under its own name; a workspace directory out, under its own.
    local = tmp_path / "tree"
    (local / "deep").mkdir(parents=True)
    (local / "deep" / "b.bin").write_bytes(bytes(range(256)) * 64)
    written = client.upload("files", local, "in")
    assert "tree/deep/b.bin" in written, written
    assert client.exec("files", ["wc", "-c", "in/tree/deep/b.bin"]).stdout.split()[0] == b"16384"
    out = tmp_path / "out"
    client.download("files", "notes", out)
    assert (out / "notes" / "a.txt").read_bytes() == b"\x00over\xff"
    with pytest.raises(IsADirectoryError):
        client.read_file("files", "notes")
    with pytest.raises(berth.NotFound):
        client.read_file("files", "missing.txt")
    with pytest.raises(ValueError):
        client.write_file("files", "notes/..", "x")


def test_logs_are_read_and_followed_to_the_runs_end(client):
    client.create("talker", ["sh", "-c", "echo one; echo two >&2; sleep 1; echo three"], wait=False)
    chunks = list(client.logs("talker", follow=True))
    out = b"".join(c.data for c in chunks if c.stream == "stdout")
    err = b"".join(c.data for c in chunks if c.stream == "stderr")
    assert (out, err) == (b"one\nthree\n", b"two\n")
    # From an offset, even one inside a chunk: what came after it. (The two streams' order in the
    # output is the order the supervisor read them, so the offset is taken from the chunks.)
    three = next(c.offset for c in chunks if c.data.startswith(b"three"))
    assert b"".join(c.data for c in client.logs("talker", offset=three)) == b"three\n"
    assert b"".join(c.data for c in client.logs("talker", offset=three + 2)) == b"ree\n"


def test_templates_keep_a_pool_that_claims_take_from(client):
    made = client.create_template("tpl", SLEEP, min_ready=1, labels={"team": "a"})
    assert (made.name, made.command, made.min_ready, made.labels) == ("tpl", SLEEP, 1, {"team": "a"})
    deadline = time.time() + 60
    while client.get_template("tpl").ready < 1:
        assert time.time() < deadline, client.get_template("tpl")
        time.sleep(0.1)
    claimed = client.claim("tpl", labels={"who": "me"})
    assert claimed.phase == "Ready" and claimed.labels["who"] == "me", claimed
    assert claimed.name not in client.get_template("tpl").members
    assert [t.name for t in client.list_templates()] == ["tpl"]
    assert client.set_pool("tpl", 0).min_ready == 0
    with pytest.raises(berth.Unavailable):
        client.claim("tpl")
    client.delete_template("tpl")
    with pytest.raises(berth.NotFound):
        client.get_template("tpl")
    client.delete(claimed.name)


def test_renew_moves_the_deadline_and_an_exec_past_its_timeout_raises(client):
    box = client.create("renewed", SLEEP, ttl=60)
    renewed = client.renew("renewed", ttl=3600)
    assert renewed.deadline > box.deadline + dt.timedelta(minutes=50), (box.deadline, renewed.deadline)
    with pytest.raises(berth.InvalidArgument):
        client.renew("renewed", ttl=60, deadline=time.time() + 60)
    with pytest.raises(berth.ExecTimeout) as late:
        client.exec("renewed", ["sh", "-c", "echo started; sleep 30"], timeout=1)
    assert isinstance(late.value, TimeoutError)
    assert (late.value.stdout, late.value.timeout, late.value.result.state) == (b"started\n", 1, "TimedOut")
