"""A real gateway serving E2B's API (`--e2b-listen`) for each test, and the unmodified `e2b`
SDK pointed at it the way its documentation says: `E2B_API_URL` and `E2B_API_KEY` (Berth's
API token). `BERTH_GATEWAY_BIN` names the binary; by default the repository's debug build."""

from __future__ import annotations

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
    def __init__(self, data_dir: Path) -> None:
        binary = Path(os.environ.get("BERTH_GATEWAY_BIN", REPO / "target" / "debug" / "berth-gateway"))
        if not binary.exists():
            pytest.fail(f"no gateway binary at {binary}: run `cargo build --bins`, or set BERTH_GATEWAY_BIN")
        data_dir.mkdir(mode=0o700, parents=True)
        self.data_dir = data_dir
        self.e2b_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        self.process = subprocess.Popen(
            [str(binary), "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{free_port()}",
             "--e2b-listen", f"127.0.0.1:{self.e2b_port}", "--poll-interval", "500ms", "--stop-grace", "2s"],
            stdout=subprocess.DEVNULL, stderr=open(data_dir / "gateway.log", "ab"), env=env,
        )
        address = data_dir / "gateway.addr"
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
        out = subprocess.run([str(self.berth), "--data-dir", str(self.data_dir), "e2b", "env"],
                             check=True, capture_output=True, text=True).stdout
        return dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in out.splitlines())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    g = Gateway(tmp_path / "data")
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # Pointed at the gateway the way the README says: `eval "$(berth e2b env)"`.
    exports = g.exports()
    assert exports == {"E2B_API_URL": g.url, "E2B_SANDBOX_URL": g.url, "E2B_API_KEY": g.token}
    for name, value in exports.items():
        monkeypatch.setenv(name, value)
    yield g
    from e2b import Sandbox

    # What a test left is killed through the API it used: the process driver's runs outlive
    # their gateway otherwise.
    monkeypatch.setenv("E2B_API_KEY", g.token)
    paginator = Sandbox.list()
    while paginator.has_next:
        for info in paginator.next_items():
            Sandbox.kill(info.sandbox_id)
    g.stop()
