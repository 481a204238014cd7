"""A real gateway serving E2B's API (`--e2b-listen`) for each test, and the unmodified `e2b`
SDK pointed at it the way its documentation says: `E2B_API_URL` and `E2B_API_KEY` (Berth's
API token). `BERTH_GATEWAY_BIN` names the binary; by default the repository's debug build."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    def __init__(self, data_dir: Path, *extra: str, name: str = "gateway") -> None:
        binary = Path(os.environ.get("BERTH_GATEWAY_BIN", REPO / "target" / "debug" / "berth-gateway"))
        if not binary.exists():
            pytest.fail(f"no gateway binary at {binary}: run `cargo build --bins`, or set BERTH_GATEWAY_BIN")
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.data_dir = data_dir
        self.e2b_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        self.process = subprocess.Popen(
            [str(binary), "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{free_port()}",
             "--e2b-listen", f"127.0.0.1:{self.e2b_port}", "--poll-interval", "500ms", "--stop-grace", "2s", "--name", name, *extra],
            stdout=subprocess.DEVNULL, stderr=open(data_dir / "gateway.log", "ab"), env=env,
        )
        address = data_dir / f"{name}.addr"
        for _ in range(400):
            if address.exists() and address.read_text().strip():
                break
            if self.process.poll() is not None:
                raise RuntimeError(f"the gateway exited: {(data_dir / 'gateway.log').read_text()}")
            time.sleep(0.05)
        else:
            raise RuntimeError("the gateway did not start")
        self.token = (data_dir / "api-token").read_text().strip()
        self.url = f"http://127.0.0.1:{self.e2b_port}"
        self.berth = binary.with_name("berth")

    def exports(self) -> dict[str, str]:
        """What `berth e2b env` prints, as a user's shell would take it."""
        out = self.cli("e2b", "env")
        return dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in out.splitlines())

    def cli(self, *args: str) -> str:
        """`berth ARGS` against this gateway, its output."""
        return subprocess.run([str(self.berth), "--data-dir", str(self.data_dir), *args],
                              check=True, capture_output=True, text=True).stdout

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def pointed_at(g: Gateway, monkeypatch) -> None:
    """The SDK pointed at `g` the way the README says: `eval "$(berth e2b env)"`."""
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    exports = g.exports()
    assert exports == {"E2B_API_URL": g.url, "E2B_SANDBOX_URL": g.url, "E2B_API_KEY": g.token}
    for name, value in exports.items():
        monkeypatch.setenv(name, value)


def kill_all(g: Gateway, monkeypatch) -> None:
    """What a test left, killed through the API it used: the process driver's runs outlive their
    gateway otherwise."""
    from e2b import Sandbox

    monkeypatch.setenv("E2B_API_KEY", g.token)
    paginator = Sandbox.list()
    while paginator.has_next:
        for info in paginator.next_items():
            Sandbox.kill(info.sandbox_id)


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    g = Gateway(tmp_path / "data")
    pointed_at(g, monkeypatch)
    yield g
    kill_all(g, monkeypatch)
    g.stop()


def postgres_store(schema: str) -> str:
    """A store URL in a fresh schema of the test PostgreSQL (`ci/postgres up`, then
    `export $(ci/postgres env)`). Without one the test is skipped, saying so; under `ci/test`
    (BERTH_REQUIRE_POSTGRES=1) it fails."""
    url = os.environ.get("BERTH_TEST_POSTGRES_URL")
    if not url:
        why = "no PostgreSQL: BERTH_TEST_POSTGRES_URL is unset (ci/postgres up; export $(ci/postgres env))"
        if os.environ.get("BERTH_REQUIRE_POSTGRES") == "1":
            pytest.fail(why)
        pytest.skip(why)
    made = f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    subprocess.run(["psql", "-q", url, "-c", made], check=True, capture_output=True)
    return f"{url}?options=-csearch_path%3D{schema}"


@pytest.fixture
def two_nodes(tmp_path, monkeypatch):
    """Two hosts' worth: gateways with data directories of their own (so each its own node, n1
    and n2) sharing one PostgreSQL database and the API token, each serving E2B's API. The SDK
    speaks to n1's."""
    store = ("--store", postgres_store("e2b_two_nodes"), "--lease-ttl", "2s")
    n1 = Gateway(tmp_path / "n1", *store, "--node", "n1", name="n1")
    (tmp_path / "n2").mkdir(mode=0o700)
    (tmp_path / "n2" / "api-token").write_text(n1.token)
    (tmp_path / "n2" / "api-token").chmod(0o600)
    n2 = Gateway(tmp_path / "n2", *store, "--node", "n2", name="n2")
    deadline = time.monotonic() + 30
    while sum(n["live"] for n in json.loads(n1.cli("-o", "json", "node", "list")) or []) < 2:
        assert time.monotonic() < deadline, n1.cli("node", "list")
        time.sleep(0.1)
    pointed_at(n1, monkeypatch)
    yield n1, n2
    kill_all(n1, monkeypatch)
    n2.stop()
    n1.stop()
