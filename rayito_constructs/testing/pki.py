"""A throw-away certificate authority for the TLS front (``front.py``), made at run time.

The product's unmodified client (its CLI) talks TLS to ``<endpoint>:443`` and trusts the system's
roots: gRPC reads ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``, Python's ``ssl`` ``SSL_CERT_FILE``. A test
points both at :attr:`TestCa.ca_file`, and every VM's front presents a certificate for its own IP
(an IP SAN, no SNI: the client dials an IP) signed by this CA.

Nothing here is ever written to the repository: the CA's private key lives in memory only, and
each leaf's key is written to a private (0700) temporary directory just long enough for
``SSLContext.load_cert_chain`` to read it, then deleted. The CA is made with the ``cryptography``
package when it is installed (moto depends on it), else with the ``openssl`` command.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

VALID_DAYS = 2


class TestCa:
    """A CA whose certificate is written to ``<directory>/ca.pem`` (public; the only file kept)."""

    __test__ = False  # not a pytest test class

    def __init__(self, directory: Path) -> None:
        self._directory = Path(directory)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._private = Path(tempfile.mkdtemp(prefix="rayd-pki-"))
        os.chmod(self._private, 0o700)
        self._lock = threading.Lock()
        self._backend: Any = _CryptographyCa() if _has_cryptography() else _OpensslCa(self._private)
        self.ca_file = self._directory / "ca.pem"
        self.ca_file.write_bytes(self._backend.ca_pem())

    def server_context(self, ip: str) -> ssl.SSLContext:
        """A server context presenting a certificate for ``ip``, offering ALPN ``h2`` and
        ``http/1.1`` (the AWS proxy's one port carries gRPC and HTTP/1.1)."""
        with self._lock:
            cert_pem, key_pem = self._backend.leaf(ip)
            folder = Path(tempfile.mkdtemp(dir=self._private))
            try:
                cert, key = folder / "leaf.pem", folder / "leaf.key"
                cert.write_bytes(cert_pem)
                key.touch(0o600)
                key.write_bytes(key_pem)
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(cert, key)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        context.set_alpn_protocols(["h2", "http/1.1"])
        return context

    def close(self) -> None:
        shutil.rmtree(self._private, ignore_errors=True)


def _has_cryptography() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


class _CryptographyCa:
    def __init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._ec, self._oid = x509, hashes, ec, NameOID
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rayito_constructs test CA (throw-away)")])
        now = dt.datetime.now(dt.timezone.utc)
        self._name = name
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )

    def ca_pem(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding

        return self._cert.public_bytes(Encoding.PEM)

    def leaf(self, ip: str) -> tuple[bytes, bytes]:
        from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

        x509 = self._x509
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(self._oid.COMMON_NAME, ip)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, self._hashes.SHA256())
        )
        key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        return cert.public_bytes(Encoding.PEM), key_pem


class _OpensslCa:
    """The same with the ``openssl`` command (when ``cryptography`` is not installed)."""

    def __init__(self, private: Path) -> None:
        if shutil.which("openssl") is None:
            raise RuntimeError("the TLS front needs the 'cryptography' package or the 'openssl' command")
        self._dir = private
        self._key = private / "ca.key"
        self._cert = private / "ca.pem"
        self._serial = 1
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(self._key), "-out", str(self._cert), "-days", str(VALID_DAYS),
                 "-subj", "/CN=rayito_constructs test CA (throw-away)",
                 "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")

    def ca_pem(self) -> bytes:
        return self._cert.read_bytes()

    def leaf(self, ip: str) -> tuple[bytes, bytes]:
        folder = Path(tempfile.mkdtemp(dir=self._dir))
        try:
            key, csr, cert, ext = (folder / n for n in ("leaf.key", "leaf.csr", "leaf.pem", "ext.cnf"))
            ext.write_text(f"subjectAltName=IP:{ip}\nbasicConstraints=critical,CA:FALSE\n"
                           "extendedKeyUsage=serverAuth\n")
            _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                     "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={ip}")
            self._serial += 1
            _openssl("x509", "-req", "-in", str(csr), "-CA", str(self._cert), "-CAkey", str(self._key),
                     "-set_serial", str(self._serial), "-days", str(VALID_DAYS), "-extfile", str(ext),
                     "-out", str(cert))
            return cert.read_bytes(), key.read_bytes()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _openssl(*args: str, timeout: Optional[float] = 30) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=timeout)
