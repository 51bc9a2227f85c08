"""A throwaway certificate authority for TLS on one machine (tests, benches, a secured dev stack):
a CA, a server certificate for `localhost` / 127.0.0.1 and a client certificate, as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class DevPki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def make_dev_pki(directory: Path, *, days: int = 2) -> DevPki:
    """Write ca.pem, server.pem/-key.pem (SAN localhost, 127.0.0.1) and client.pem/-key.pem."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "toolbus dev CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        name: str, usage: x509.ObjectIdentifier, san: bool
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(ca_key, hashes.SHA256()), key

    server, server_key = leaf("localhost", ExtendedKeyUsageOID.SERVER_AUTH, san=True)
    client, client_key = leaf("toolbus-client", ExtendedKeyUsageOID.CLIENT_AUTH, san=False)
    pki = DevPki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
    )
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    pki.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.server_key, server_key)
    _write_key(pki.client_key, client_key)
    return pki
