"""A real gateway for each test: `berth-gateway` (the process driver, SQLite) in a fresh data
directory. `BERTH_GATEWAY_BIN` names the binary; by default the repository's debug build."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

import pytest

REPO = Path(__file__).resolve().parents[3]


def gateway_bin() -> Path:
    path = Path(os.environ.get("BERTH_GATEWAY_BIN", REPO / "target" / "debug" / "berth-gateway"))
    if not path.exists():
        pytest.fail(f"no gateway binary at {path}: run `cargo build --bins`, or set BERTH_GATEWAY_BIN")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """One gateway process; `restart()` kills it (SIGKILL) and starts it again on its port.
    `extra`: more flags for it."""

    def __init__(self, data_dir: Path, extra: Sequence[str] = ()) -> None:
        self.data_dir = data_dir
        self.extra = list(extra)
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.port = free_port()
        #: The preview proxy's port.
        self.proxy_port = free_port()
        self.process = None
        self.start()

    def start(self) -> None:
        address_file = self.data_dir / "gateway.addr"
        address_file.unlink(missing_ok=True)
        log = open(self.data_dir / "gateway.log", "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        self.process = subprocess.Popen(
            [str(gateway_bin()), "--data-dir", str(self.data_dir), "--listen", f"127.0.0.1:{self.port}",
             "--poll-interval", "500ms", "--stop-grace", "5s", "--heartbeat", "1s",
             "--proxy-listen", f"127.0.0.1:{self.proxy_port}", *self.extra],
            stdout=subprocess.DEVNULL, stderr=log, env=env,
        )
        for _ in range(400):
            if address_file.exists() and address_file.read_text().strip():
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"the gateway exited: {(self.data_dir / 'gateway.log').read_text()}")
            time.sleep(0.05)
        raise RuntimeError("the gateway did not start")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def gateway(tmp_path):
    g = Gateway(tmp_path / "data")
    yield g
    # Sandboxes of the process driver outlive their gateway: a last one, started again, deletes
    # what the test left.
    g.restart()
    import berth

    with berth.Client(data_dir=g.data_dir) as client:
        for s in client.list():
            # One may go between the listing and its delete (a deleted template's pool member).
            try:
                client.delete(s.name, timeout=30)
            except berth.NotFound:
                pass
    g.kill()


@pytest.fixture
def client(gateway):
    import berth

    with berth.Client(data_dir=gateway.data_dir) as c:
        yield c
