"""Where the gateway is and which token it takes: arguments, `BERTH_*` variables, or the
gateway's data directory, as the `berth` CLI finds them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple

import grpc

DEFAULT_NAME = "gateway"
DEFAULT_ADDRESS = "127.0.0.1:7420"


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME")
    return Path(base) / "berth" if base else Path.home() / ".local" / "share" / "berth"


def _read(path: Path) -> Optional[str]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def target(address: str) -> Tuple[str, bool]:
    """The gRPC target of an address (`http://host:port`, `https://host:port` or `host:port`),
    and whether it takes TLS."""
    if address.startswith("https://"):
        return address[len("https://") :].rstrip("/"), True
    if address.startswith("http://"):
        return address[len("http://") :].rstrip("/"), False
    return address, False


def credentials(ca_file: Optional[os.PathLike]) -> grpc.ChannelCredentials:
    """TLS that checks the gateway's certificate against `ca_file` (PEM), else `BERTH_CA_FILE`,
    else the system's roots, as the CLI's `--ca-file` does."""
    path = ca_file or os.environ.get("BERTH_CA_FILE")
    return grpc.ssl_channel_credentials(root_certificates=Path(path).read_bytes() if path else None)


def resolve(
    address: Optional[str], token: Optional[str], data_dir: Optional[os.PathLike], name: Optional[str]
) -> Tuple[str, str]:
    """The gateway's address and token."""
    data = Path(data_dir or os.environ.get("BERTH_DATA_DIR") or default_data_dir())
    name = name or os.environ.get("BERTH_GATEWAY_NAME")
    address = address or os.environ.get("BERTH_GATEWAY")
    if address is None:
        if name is not None:
            address = _read(data / f"{name}.addr")
            if address is None:
                raise ValueError(f"no gateway named {name!r} has run from {data} (no {name}.addr)")
        else:
            address = _read(data / f"{DEFAULT_NAME}.addr")
        if address is None:
            found = sorted(p for p in data.glob("*.addr")) if data.is_dir() else []
            if len(found) > 1:
                names = ", ".join(p.stem for p in found)
                raise ValueError(f"several gateways have run from {data}: {names}; pass name= or address=")
            address = (_read(found[0]) if found else None) or DEFAULT_ADDRESS
    token = token or os.environ.get("BERTH_TOKEN") or _read(data / "api-token")
    if token is None:
        raise ValueError(f"no API token: pass token=, set BERTH_TOKEN, or point data_dir= at the gateway's ({data})")
    return address, token
