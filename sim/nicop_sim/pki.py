"""Certificates and keys for the local control plane.

A throw-away CA signs the API server's serving certificate and one client certificate per
identity (admin, controller-manager, scheduler), so RBAC sees the same users as on a kubeadm
cluster. ECDSA P-256 keeps generation to milliseconds.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


class CertificateAuthority:
    """A CA kept on disk under `directory`, created on first use and reused afterwards."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pair = KeyPair(directory / "ca.crt", directory / "ca.key")
        if not self.pair.cert.exists():
            self._create()
        self._key = serialization.load_pem_private_key(self.pair.key.read_bytes(), None)
        self._cert = x509.load_pem_x509_certificate(self.pair.cert.read_bytes())

    def _create(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("nicop-local-ca"))
            .issuer_name(_name("nicop-local-ca"))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY * 10)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        _write_key(key, self.pair.key)
        self.pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        common_name: str,
        organization: str | None = None,
        *,
        server_hosts: list[str] | None = None,
    ) -> KeyPair:
        """Issue (once) a client certificate, or a serving one when `server_hosts` is given."""
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_hosts:
            sans: list[x509.GeneralName] = []
            for host in server_hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(
                x509.SubjectAlternativeName(sans), critical=False
            ).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        else:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        assert isinstance(self._key, ec.EllipticCurvePrivateKey)
        cert = builder.sign(self._key, hashes.SHA256())
        _write_key(key, pair.key)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair


def service_account_keys(directory: Path) -> KeyPair:
    """The key pair that signs service account tokens (`cert` holds the public key)."""
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    if not pair.key.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(key, pair.key)
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return pair
