"""A test PKI: CAs and leaf certificates written as PEM files, for real TLS handshakes.

    ca = TestCA.create(tmp_path, "lab-ca")
    agent = ca.issue("node-a", dns=["node-a.az-a.lab"], uri=["spiffe://lab/node/node-a"])
    agent.cert_file, agent.key_file, ca.cert_file

Keys are EC P-256 (fast to make), written mode 0600 as the key checks require.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(path, 0o600)


@dataclass
class Leaf:
    name: str
    cert_file: str
    key_file: str


@dataclass
class TestCA:
    __test__ = False  # not a pytest class
    name: str
    directory: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_file(self) -> str:
        return str(self.directory / f"{self.name}.crt")

    @classmethod
    def create(cls, directory: Path, name: str = "test-ca") -> "TestCA":
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        ca = cls(name, directory, cert, key)
        Path(ca.cert_file).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / f"{name}.key", key)
        return ca

    def issue(self, name: str, *, dns: list[str] | None = None, uri: list[str] | None = None,
              ips: list[str] | None = None, expired: bool = False, file_stem: str | None = None) -> Leaf:
        """A leaf for both server and client use. `expired` makes one that ended yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        start, end = ((now - dt.timedelta(days=10), now - dt.timedelta(days=1)) if expired
                      else (now - dt.timedelta(hours=1), now + dt.timedelta(days=7)))
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in (dns or [])]
        sans += [x509.UniformResourceIdentifier(u) for u in (uri or [])]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in (ips or [])]
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        stem = file_stem or name
        cert_path = self.directory / f"{stem}.crt"
        key_path = self.directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return Leaf(name, str(cert_path), str(key_path))
