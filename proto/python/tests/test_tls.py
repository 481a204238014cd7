"""TLS: a gateway given a certificate is reached at its https:// address by a client that trusts
the CA which signed it (`ca_file=`, or `BERTH_CA_FILE`), and refused by one that does not."""

from __future__ import annotations

import datetime
import ipaddress
from typing import Dict

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import berth
from berth.aio import AsyncClient

from conftest import Gateway


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _signed(subject: str, key, issuer: x509.Name, issuer_key, extensions) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())


def _authority(name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    return key, _signed(name, key, _name(name), key, [(x509.BasicConstraints(ca=True, path_length=None), True)])


@pytest.fixture
def certificates(tmp_path) -> Dict[str, str]:
    """A CA, a certificate it signed for localhost and 127.0.0.1 with its key, and a CA that
    signed nothing here, as PEM files."""
    ca_key, ca = _authority("Berth test CA")
    _, stranger = _authority("Some other CA")
    key = ec.generate_private_key(ec.SECP256R1())
    names = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = _signed("localhost", key, ca.subject, ca_key, [(names, False)])
    pem = serialization.Encoding.PEM
    files = {
        "ca": ca.public_bytes(pem),
        "stranger": stranger.public_bytes(pem),
        "cert": cert.public_bytes(pem),
        "key": key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    }
    directory = tmp_path / "tls"
    directory.mkdir()
    for name, data in files.items():
        (directory / f"{name}.pem").write_bytes(data)
    return {name: str(directory / f"{name}.pem") for name in files}


@pytest.fixture
def tls_gateway(tmp_path, certificates):
    g = Gateway(tmp_path / "data", ["--tls-cert", certificates["cert"], "--tls-key", certificates["key"]])
    yield g
    g.restart()
    with berth.Client(data_dir=g.data_dir, ca_file=certificates["ca"]) as client:
        for s in client.list():
            client.delete(s.name, timeout=30)
    g.kill()


def test_a_client_trusting_the_ca_reaches_a_tls_gateway_and_any_other_is_refused(tls_gateway, certificates, monkeypatch):
    data = tls_gateway.data_dir
    assert (data / "gateway.addr").read_text().startswith("https://127.0.0.1:")
    with berth.Client(data_dir=data, ca_file=certificates["ca"]) as client:
        assert client.create("secure", ["sleep", "3600"]).phase == "Ready"
        assert client.port_url("secure", 8080).url.startswith(f"https://127.0.0.1:{tls_gateway.proxy_port}/")
    # The system's roots, or a CA that did not sign it: the certificate is refused.
    for ca in [None, certificates["stranger"]]:
        with berth.Client(data_dir=data, ca_file=ca, timeout=5) as client:
            with pytest.raises(berth.Unavailable):
                client.list()
    monkeypatch.setenv("BERTH_CA_FILE", certificates["ca"])
    with berth.Client(data_dir=data) as client:
        assert [s.name for s in client.list()] == ["secure"]


async def test_the_async_client_speaks_tls_to_a_tls_gateway(tls_gateway, certificates):
    async with AsyncClient(data_dir=tls_gateway.data_dir, ca_file=certificates["ca"]) as client:
        assert (await client.info())["store"] == "sqlite"
    async with AsyncClient(data_dir=tls_gateway.data_dir, ca_file=certificates["stranger"], timeout=5) as client:
        with pytest.raises(berth.Unavailable):
            await client.info()
