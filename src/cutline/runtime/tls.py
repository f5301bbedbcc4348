"""A job's key material: the handshake secret and, with TLS on, the job's own certificate.

The driver makes one :class:`JobSecret` per run and ships it to every task with the job
(inside the pickled task closure, never on a command line or in an environment variable).
It holds

* ``key``: 32 random bytes, the HMAC key of :mod:`.net`'s challenge/response handshake;
* with TLS on, a self-signed certificate and its private key (ECDSA P-256, made by the
  driver with the ``cryptography`` package, valid for the run's lifetime): every listener
  of the job (data channels, control port) presents it and requires it from the client,
  and every client pins it (nothing else is trusted: no CA, no host names).  TLS 1.3 only.

Nothing about it shows in ``repr``, ``str`` or a log line.  Its ``ssl`` contexts are built
once per process, on first use; the private key reaches ``ssl`` through a file readable by
the owner only that is deleted at once (``SSLContext.load_cert_chain`` reads files only).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import ssl
import tempfile
import threading
from typing import Any

__all__ = ["JobSecret", "make_certificate"]

_LOCK = threading.Lock()


def make_certificate(days: float = 30.0) -> tuple[bytes, bytes]:
    """A fresh self-signed certificate and its private key, both PEM.  Valid for
    ``127.0.0.1``, ``::1`` and ``localhost`` too, so a browser or Prometheus may be told to
    trust it for the dashboard."""
    import ipaddress

    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:  # pragma: no cover - a dependency of cutline
        raise ImportError("TLS needs the cryptography package (pip install cryptography) to "
                          "make the job's certificate") from exc
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cutline job")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


class JobSecret:
    """The per-job secret (and TLS certificate); opaque to everything but :mod:`.net`.

    ``mutual``: a listener asks the client for the job's certificate too (tasks and driver
    all hold it); False for the admin port, whose clients know the certificate (to pin it)
    and the admin token, not the private key."""

    __slots__ = ("_contexts", "cert", "key", "mutual", "private_key")

    def __init__(self, key: bytes, cert: bytes | None = None,
                 private_key: bytes | None = None, *, mutual: bool = True) -> None:
        if not isinstance(key, (bytes, bytearray)) or not key:
            raise ValueError("a job secret is a non-empty bytes key")
        self.key, self.cert, self.private_key = bytes(key), cert, private_key
        self.mutual = mutual
        self._contexts: dict[str, ssl.SSLContext] = {}

    @classmethod
    def new(cls, tls: bool = False) -> JobSecret:
        """A fresh secret for one run; with a fresh certificate when ``tls``."""
        cert, private = make_certificate() if tls else (None, None)
        return cls(secrets.token_bytes(32), cert, private)

    @classmethod
    def of(cls, secret: JobSecret | bytes) -> JobSecret:
        """``secret`` as a JobSecret (raw bytes: a plaintext job's key)."""
        return secret if isinstance(secret, JobSecret) else cls(secret)

    def sibling(self, key: bytes, *, mutual: bool) -> JobSecret:
        """Another key with this one's certificate (the admin port's token)."""
        return JobSecret(key, self.cert, self.private_key, mutual=mutual)

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def fingerprint(self) -> str | None:
        """SHA-256 of the certificate (DER), as ``openssl x509 -fingerprint`` shows it."""
        if self.cert is None:
            return None
        der = ssl.PEM_cert_to_DER_cert(self.cert.decode())
        return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())

    def __repr__(self) -> str:
        return f"JobSecret(tls={'on' if self.tls else 'off'}, key=<hidden>)"

    __str__ = __repr__

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "cert": self.cert, "private_key": self.private_key,
                "mutual": self.mutual}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        self._contexts = {}

    # ------------------------------------------------------------------ ssl contexts

    def server_context(self) -> ssl.SSLContext:
        return self._context("server")

    def client_context(self) -> ssl.SSLContext:
        return self._context("client")

    def _context(self, side: str) -> ssl.SSLContext:
        if self.cert is None:
            raise ValueError("this job runs without TLS")
        ctx = self._contexts.get(side)
        if ctx is not None:
            return ctx
        with _LOCK:
            if side in self._contexts:
                return self._contexts[side]
            server = side == "server"
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.check_hostname = False  # the certificate is pinned: no names to check
            ctx.load_verify_locations(cadata=self.cert.decode())
            if server:
                ctx.num_tickets = 0  # no resumption: one connection per peer and attempt
                ctx.verify_mode = ssl.CERT_REQUIRED if self.mutual else ssl.CERT_NONE
            else:
                ctx.verify_mode = ssl.CERT_REQUIRED
            if (server or self.mutual) and self.private_key is not None:
                _load_chain(ctx, self.cert, self.private_key)
            self._contexts[side] = ctx
        return ctx


def _load_chain(ctx: ssl.SSLContext, cert: bytes, private_key: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="cutline-tls-") as tmp:  # mode 0700
        path = os.path.join(tmp, "job.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private_key + cert)
        ctx.load_cert_chain(path)
