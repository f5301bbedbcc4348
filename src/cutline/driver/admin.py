"""Control of a running job from outside its process: ``cutline savepoint STORAGE JOB``.

While a job runs, its driver listens on one more port for *admin* connections, checked by
the same HMAC handshake as the tasks' (:mod:`cutline.runtime.net`, purpose ``"admin"``) but
with its own token, and announces itself in
``<storage>/<job>/_job.json`` (address, token, pid).  Whoever can read the job's checkpoint
storage can already read and restore its state; that is who may ask for a savepoint.  The
file is removed when the run ends; a stale one (the driver died) gives a clear error.

With the job's TLS on, the admin port speaks TLS with the job's certificate, which the file
also holds (the certificate, never its key): the client pins it; the token, checked inside
TLS, is what admits it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from typing import Any

from ..protocol import messages as m
from ..runtime import net
from ..runtime.control import FrameConnection, HandshakeError
from ..runtime.tls import JobSecret

log = logging.getLogger("cutline.admin")

__all__ = ["AdminServer", "JOB_FILE", "request_savepoint"]

JOB_FILE = "_job.json"
ADMIN = "admin"  # the handshake's purpose: a control-port answer is refused here


class AdminServer:
    """Answers :class:`~cutline.protocol.messages.SavepointRequest` for one running job:
    ``run`` has its ``storage``, its name (``job``) and ``savepoint(stop)`` (a
    :class:`~cutline.driver.dataflow.DataflowRun`); ``secret``: the driver's
    :class:`~cutline.runtime.tls.JobSecret`, whose TLS certificate the port uses when on."""

    def __init__(self, run: Any, host: str, secret: JobSecret | None = None) -> None:
        self.run = run
        self.token = secrets.token_bytes(32)
        self._cert = secret.cert if secret is not None else None
        key: JobSecret | bytes = self.token
        if secret is not None and secret.tls:
            key = secret.sibling(self.token, mutual=False)
        self._listener = net.Listener(host, key, admit=net.only(ADMIN), serve=self._serve,
                                      name="cutline-admin", log=log,
                                      refusal="refused admin connection")
        self.address = self._listener.address
        self._path = f"{run.storage.dir}/{JOB_FILE}"

    def start(self) -> None:
        info = {"job": self.run.job, "host": self.address[0], "port": self.address[1],
                "token": self.token.hex(), "pid": os.getpid()}
        if self._cert is not None:
            info["cert"] = self._cert.decode()
        fs = self.run.storage.fs
        try:
            fs.pipe_file(self._path, json.dumps(info).encode())
            if "file" in fs.protocol:  # an object store's own permissions guard the rest
                os.chmod(self._path, 0o600)
        except Exception as exc:  # noqa: BLE001 - the job runs without outside control
            log.warning("could not write %s (cutline savepoint will not find the job): %s",
                        self._path, exc)
        self._listener.start()

    def stop(self) -> None:
        """Stop listening at once; a request in progress still gets its answer (the driver
        fails pending savepoints right after this) for up to 10 s, then its connection is
        closed: in the background, so the driver's stop never waits for an admin client."""
        threading.Thread(target=self._listener.close, kwargs={"wait": 10.0}, daemon=True,
                         name="cutline-admin-close").start()
        try:
            fs = self.run.storage.fs
            raw = fs.cat_file(self._path)
            if json.loads(raw).get("token") == self.token.hex():  # ours, not a newer run's
                fs.rm_file(self._path)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _serve(self, raw: net.Connection) -> None:
        conn = FrameConnection(raw)  # closed by the listener when this returns
        try:
            try:
                msg = conn.recv()
            except m.MessageError as exc:
                log.error("admin request from %s refused: %s", raw.peer, exc)
                conn.send(m.SavepointReply(False, error=f"request refused: {exc}"))
                return
            if type(msg) is not m.SavepointRequest:
                log.error("admin request from %s refused: unexpected %r", raw.peer, msg)
                conn.send(m.SavepointReply(False, error=f"unknown request {type(msg).TAG!r}"))
                return
            future = self.run.savepoint(stop=msg.stop)
            try:
                path = future.result(timeout=msg.timeout)
                conn.send(m.SavepointReply(True, path=path))
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                conn.send(m.SavepointReply(False, error=str(exc)))
        except (ConnectionError, OSError):
            pass


def request_savepoint(storage: Any, stop: bool = False, timeout: float = 600.0) -> str:
    """Ask the running job whose storage is ``storage`` (a ``CheckpointStorage``) for a
    savepoint; returns its path."""
    path = f"{storage.dir}/{JOB_FILE}"
    try:
        info = json.loads(storage.fs.cat_file(path))
    except FileNotFoundError:
        raise RuntimeError(f"job {storage.job!r} is not running: no {JOB_FILE} under "
                           f"{storage.fs.unstrip_protocol(storage.dir)}") from None
    address = (info["host"], int(info["port"]))
    cert = info.get("cert")
    key = JobSecret(bytes.fromhex(info["token"]), cert.encode() if cert else None,
                    mutual=False)
    try:
        conn = FrameConnection(net.connect(address, key, ADMIN, timeout=10.0))
    except (OSError, HandshakeError) as exc:
        raise RuntimeError(f"job {storage.job!r} is not running: its driver (pid {info.get('pid')}"
                           f") at {address[0]}:{address[1]} does not answer ({exc}); "
                           f"{JOB_FILE} is left from a run that died") from None
    try:
        conn.send(m.SavepointRequest(stop, float(timeout)))
        conn.settimeout(timeout + 10)
        reply = conn.recv()
    finally:
        conn.close()
    if type(reply) is not m.SavepointReply:
        raise RuntimeError(f"the job's driver answered {reply!r} to a savepoint request")
    if not reply.ok or reply.path is None:
        raise RuntimeError(reply.error or "the savepoint failed")
    return reply.path
