"""One job per storage: the lease a running job holds in its job directory.

Two drivers writing one job's checkpoints would interleave their checkpoint ids, delete each
other's retained checkpoints and restore from each other's state.  So a driver holds a
*lease* while it runs: a small JSON file ``<job dir>/_lease-<n>`` saying who holds it (host,
pid, run id, start time, dashboard URL) and when it last said so (``heartbeat``, refreshed
every :data:`HEARTBEAT` seconds).

- **Acquire**: the holder is the lease with the highest ``n``.  When there is none, or its
  holder is gone, a driver creates ``_lease-<n+1>`` *exclusively* (written aside and
  hard-linked on local disks, a conditional ``PUT`` with ``If-None-Match: *`` on S3): of
  two drivers starting at once, exactly one creates it, and the other then finds a live
  holder and is refused.
- **Gone** means: its heartbeat is older than :data:`STALE_AFTER` seconds; or it was
  written on this host by a process that no longer exists (a driver killed with ``kill -9``
  and started again takes over at once); or by this process for a run that has ended.
- **Refused**: :class:`JobAlreadyRunningError` names the running job's host, pid, start
  and dashboard, before anything is written.
- **Lost**: a holder whose heartbeats stalled past :data:`STALE_AFTER` (a frozen driver) may
  find a newer lease when it wakes up; it stops at once (``on_lost``) rather than write a
  checkpoint into a job that another driver now runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .checkpoints import CheckpointStorage, CheckpointStorageError, _is_local, _write

__all__ = ["HEARTBEAT", "STALE_AFTER", "JobAlreadyRunningError", "JobLease", "check_free"]

log = logging.getLogger("cutline.lease")

HEARTBEAT = 5.0      # seconds between a holder's refreshes of its lease
STALE_AFTER = 30.0   # a lease not refreshed for this long is taken over
PREFIX = "_lease-"
_LEASE = re.compile(r"^_lease-(\d+)$")

# runs of this process that hold a lease now: a lease of this pid naming another run is
# left over from a run that ended without releasing it (a thread abandoned by a test, say)
_ACTIVE: set[str] = set()
_ACTIVE_LOCK = threading.Lock()


class JobAlreadyRunningError(CheckpointStorageError):
    """Another driver runs this job on this checkpoint storage (its lease is live)."""


def _host() -> str:
    return socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: someone else's process, it exists
        return True
    return True


def _create_exclusive(fs: Any, path: str, data: bytes) -> None:
    """Write ``path`` only if it does not exist (else :class:`FileExistsError`), whole or
    not at all: a reader never sees it half written."""
    if _is_local(fs):  # written aside, then hard-linked: link() fails if the name exists
        local = fs._strip_protocol(path)
        tmp = f"{local}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, local)
        finally:
            os.unlink(tmp)
        return
    if type(fs).__module__.startswith("s3fs"):  # a conditional PUT (If-None-Match: *)
        fs.pipe_file(path, data, mode="create")
        return
    # other filesystems: check, then write (two drivers starting in the same instant may
    # both pass; the newer lease then stops the older holder at its next heartbeat)
    if fs.exists(path):
        raise FileExistsError(path)
    fs.pipe_file(path, data)
    time.sleep(0.2)  # then whoever wrote last owns it: the others step back
    if fs.cat_file(path) != data:
        raise FileExistsError(path)


class _Holder:
    """What a lease file says, and what this process concludes about it."""

    def __init__(self, n: int, path: str, body: dict | None, age: float | None) -> None:
        self.n, self.path, self.body, self.age = n, path, body or {}, age

    def gone(self, now: float) -> str | None:
        """Why the holder is gone (a reason to take its lease over), or None: it is live."""
        b = self.body
        beat = b.get("heartbeat")
        age = (now - beat) if isinstance(beat, (int, float)) else self.age
        if age is not None and age > STALE_AFTER:
            return f"its last heartbeat was {age:.0f} s ago"
        pid = b.get("pid")
        if b.get("host") == _host() and isinstance(pid, int):
            if pid == os.getpid():
                with _ACTIVE_LOCK:
                    if b.get("run") not in _ACTIVE:
                        return "its run in this process has ended"
            elif not _pid_alive(pid):
                return f"its process {pid} on this host is gone"
        return None

    def describe(self, now: float) -> str:
        b = self.body
        if not b:
            return f"its lease {self.path} is being written"
        started = b.get("started")
        since = (time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(started))
                 if isinstance(started, (int, float)) else "")
        beat = b.get("heartbeat")
        ago = (f", last heartbeat {max(0.0, now - beat):.0f} s ago"
               if isinstance(beat, (int, float)) else "")
        board = f", dashboard {b['dashboard']}" if b.get("dashboard") else ""
        return f"run {b.get('run')} on host {b.get('host')} pid {b.get('pid')}{since}{ago}{board}"


class JobLease:
    """The lease of one run of one job on ``storage``: :meth:`acquire`, then
    :meth:`release` when the run ends.  ``dashboard``: returns the run's dashboard URL,
    when it has one (read at every heartbeat).  ``on_lost(reason)``: called from the
    heartbeat thread when another driver took the lease over."""

    def __init__(self, storage: CheckpointStorage, *, run: str | None = None,
                 dashboard: Callable[[], str | None] | None = None,
                 on_lost: Callable[[str], None] | None = None,
                 heartbeat: float = HEARTBEAT) -> None:
        self.storage = storage
        self.fs, self.dir, self.job = storage.fs, storage.dir, storage.job
        self.run = run or uuid.uuid4().hex[:12]
        self.dashboard = dashboard
        self.on_lost = on_lost
        self.heartbeat = heartbeat
        self.started = time.time()
        self.n: int | None = None
        self.took_over: str | None = None  # whose lease this run took over, and why
        self.lost: str | None = None  # why another driver took it over from this run
        self._stop = threading.Event()
        self._writing = threading.Lock()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ reading

    @property
    def path(self) -> str | None:
        return None if self.n is None else f"{self.dir}/{PREFIX}{self.n:010d}"

    def _body(self) -> dict:
        url = self.dashboard() if self.dashboard is not None else None
        return {"job": self.job, "run": self.run, "host": _host(), "pid": os.getpid(),
                "started": self.started, "heartbeat": time.time(), "dashboard": url}

    def _leases(self) -> dict[int, str]:
        try:
            names = self.fs.ls(self.dir, detail=False)
        except FileNotFoundError:
            return {}
        out = {}
        for p in names:
            m = _LEASE.match(p.rstrip("/").rsplit("/", 1)[-1])
            if m:
                out[int(m.group(1))] = p.rstrip("/")
        return out

    def holder(self) -> _Holder | None:
        """The newest lease in the job directory, read (None: no lease)."""
        leases = self._leases()
        if not leases:
            return None
        n = max(leases)
        body, age = None, None
        for _ in range(10):  # a lease being created is empty for an instant
            try:
                body = json.loads(self.fs.cat_file(leases[n]) or b"null")
            except FileNotFoundError:
                return self.holder()  # released meanwhile: look again
            except (ValueError, OSError):
                body = None
            if isinstance(body, dict):
                break
            time.sleep(0.05)
        if not isinstance(body, dict):
            with contextlib.suppress(Exception):
                age = time.time() - self.fs.modified(leases[n]).timestamp()
        return _Holder(n, leases[n], body if isinstance(body, dict) else None, age)

    # ------------------------------------------------------------------ the lease's life

    def acquire(self) -> None:
        """Hold the lease, or raise :class:`JobAlreadyRunningError` naming the holder."""
        url = self.fs.unstrip_protocol(self.dir)
        with _ACTIVE_LOCK:
            _ACTIVE.add(self.run)
        try:
            for _ in range(20):
                now = time.time()
                h = self.holder()
                if h is not None:
                    why = h.gone(now)
                    if why is None:
                        raise _refusal(self.job, url, h, now)
                n = (h.n if h is not None else 0) + 1
                try:
                    self.fs.makedirs(self.dir, exist_ok=True)
                    _create_exclusive(self.fs, f"{self.dir}/{PREFIX}{n:010d}",
                                      json.dumps(self._body()).encode())
                except FileExistsError:
                    continue  # another driver won lease n: judge it on the next pass
                self.n = n
                if h is not None:
                    self.took_over = f"{h.describe(now)} ({why})"
                    log.warning("cutline: job %r: took over the lease of %s (%s)",
                                self.job, h.describe(now), why)
                self._sweep()
                break
            else:
                raise JobAlreadyRunningError(
                    f"job {self.job!r} on {url}: other drivers keep taking its lease; "
                    "is it being started in a loop?")
        except BaseException:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(self.run)
            raise
        self._thread = threading.Thread(target=self._beat, name="cutline-lease", daemon=True)
        self._thread.start()

    def _sweep(self) -> None:
        """Delete the older leases (best effort: the newest one decides either way)."""
        for n, path in self._leases().items():
            if self.n is not None and n < self.n:
                with contextlib.suppress(Exception):
                    self.fs.rm_file(path)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                with self._writing:  # release() deletes the lease only after a write ended
                    if self._stop.is_set():
                        return
                    lost = self._lost()
                    if lost is None:
                        _write(self.fs, str(self.path), json.dumps(self._body()).encode(),
                               atomic=True)
                        continue
            except Exception as exc:  # noqa: BLE001 - storage trouble: try again next beat
                log.warning("cutline: job %r: cannot refresh its lease: %s", self.job, exc)
                continue
            log.error("cutline: %s", lost)
            self.lost = lost
            self._stop.set()
            on_lost = self.on_lost  # (None while the run starts: it reads ``lost`` then)
            if on_lost is not None:
                on_lost(lost)
            return

    def _lost(self) -> str | None:
        """Why this run no longer holds the lease (None: it does)."""
        where = f"job {self.job!r}: another driver took over its storage " \
                f"{self.fs.unstrip_protocol(self.dir)} while this one was silent"
        if any(self.n is not None and n > self.n for n in self._leases()):
            h = self.holder()
            return f"{where}: {h.describe(time.time()) if h else 'a newer lease'}"
        try:
            mine = json.loads(self.fs.cat_file(str(self.path)) or b"{}")
        except FileNotFoundError:
            return f"{where}: its lease {self.path} was deleted"
        if isinstance(mine, dict) and mine.get("run") not in (None, self.run):
            # overwritten: a filesystem without exclusive create
            return f"{where}: run {mine.get('run')} on host {mine.get('host')}"
        return None

    def release(self) -> None:
        """Give the lease up (idempotent; best effort on unreachable storage)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._writing:  # a heartbeat still writing (slow storage) finishes first
            path, self.n = self.path, None
            if path is not None:
                with contextlib.suppress(Exception):
                    self.fs.rm_file(path)
        with _ACTIVE_LOCK:
            _ACTIVE.discard(self.run)


def check_free(storage: CheckpointStorage) -> None:
    """Raise :class:`JobAlreadyRunningError` when a live driver holds the job's lease: cheap
    enough to ask before Spark starts (the driver's :meth:`JobLease.acquire` decides)."""
    probe = JobLease(storage)
    h = probe.holder()
    now = time.time()
    if h is not None and h.gone(now) is None:
        raise _refusal(storage.job, storage.fs.unstrip_protocol(storage.dir), h, now)


def _refusal(job: str, url: str, h: _Holder, now: float) -> JobAlreadyRunningError:
    return JobAlreadyRunningError(
        f"job {job!r} is already running on {url}: {h.describe(now)}. Stop it first, or give "
        "this pipeline another name or CheckpointConfig(storage=...); a lease whose holder "
        f"died is taken over once {STALE_AFTER:.0f} s pass without its heartbeat")
