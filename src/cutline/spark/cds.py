"""A class-data archive for the embedded Spark's JVM (AppCDS): a second of start-up, or more.

The embedded context's JVM loads, parses and verifies Spark's classes from its jars at
every start.  Java's application class-data sharing keeps those classes, parsed and
verified, in an archive (70-90 MB; 200 MB with a SparkSession's classes) that later JVMs
map at start: the context starts 1.6 s sooner on 2 cores, 3.0 s against 4.6 s
(``bench/startup.py --cds``).  Java 17 writes one when a JVM started with
``-XX:ArchiveClassesAtExit=FILE`` exits, and maps it with ``-XX:SharedArchiveFile=FILE``;
the JVM itself checks that the archive fits (its own binary, the same jars with the same
sizes and times) and runs without it when not.

How cutline goes about it, once per Java and Spark installation (:func:`java_options`):

* The archive lives in the user's cache (``$CUTLINE_CDS_DIR``, else
  ``$XDG_CACHE_HOME/cutline/cds`` or ``~/.cache/cutline/cds``), named by a digest of the
  Java binary, Spark's jars and the JVM options that shape the archive.
* With no archive, a run's JVM writes one when it exits (after the Python program, so
  nobody waits for it) under a temporary name, beside a file that names the writing JVM's
  pid.  One writer at a time: a temporary archive whose writer still lives (or that is
  younger than :data:`WRITER_GRACE`, its pid not yet known) means none is started.
* The next run adopts the temporary archive once its writer is gone: a JVM like the
  writer (its binary and class path) must start with it mapped, every region checked
  against the checksums written with it (``-Xshare:on -XX:+VerifySharedSpaces``, 0.2 s,
  once).  A JVM that maps an archive cut short (its writer killed while writing) crashes
  with SIGBUS the moment it touches a missing page, so nothing unchecked is ever mapped.
  The archive is then renamed in one step (readers see a whole archive or none) and its
  size and time sealed beside it: one changed since is removed, not mapped.  Runs map it
  from then on (:func:`note_use` removes one a JVM refused, so a later run writes anew).
* The JVM's own messages about archives are kept off the console (``-Xlog:cds=off``).
  ``CUTLINE_SPARK_CDS=0`` turns it all off; a cache folder that cannot be written does too.
  Linux only (a writer's JVM is told by its command line in ``/proc``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger("cutline.spark")

__all__ = ["ENV_OFF", "archive_dir", "java_options", "mapped", "note_use", "note_writer"]

ENV_OFF = "CUTLINE_SPARK_CDS"
"""Set to ``0`` (or ``false``, ``off``, ``no``) to start the JVM without an archive."""
ENV_DIR = "CUTLINE_CDS_DIR"
"""Where archives are kept, if not in the user's cache folder."""
WRITER_GRACE = 600.0
"""Seconds a temporary archive without a known writer counts as still being written."""
KEEP = 4
"""Archives kept (the most recently used): one per Java and Spark installation in use."""
MAGIC = (0xF00BABA8).to_bytes(4, "little")
"""The first bytes of a dynamic archive Java 13+ writes (``CDS_DYNAMIC_ARCHIVE_MAGIC``)."""
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_dir() -> Path:
    """The folder archives are kept in (see the module docstring)."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "cutline" / "cds"


def _enabled() -> bool:
    """On unless turned off; Linux only: a writer's JVM is told by its command line in
    ``/proc``, without which no archive would ever be adopted (each run would write one)."""
    return sys.platform.startswith("linux") and \
        os.environ.get(ENV_OFF, "1").strip().lower() not in ("0", "false", "off", "no")


def _java() -> Path | None:
    """The Java binary Spark's launcher runs (``$JAVA_HOME/bin/java``, else ``java``)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def _spark_jars() -> Path | None:
    try:
        from pyspark.find_spark_home import _find_spark_home
        jars = Path(_find_spark_home()) / "jars"
    except Exception as exc:  # noqa: BLE001 - no Spark we can read: no archive
        log.debug("cutline: no Spark home for a class-data archive: %s", exc)
        return None
    return jars if jars.is_dir() else None


def _key(java: Path, jars: Path, options: str) -> str:
    """A digest of what decides whether an archive fits: the Java binary, Spark's jars
    (names, sizes, times) and the options the archive is written under."""
    h = hashlib.sha256()
    for path in (java, *sorted(jars.iterdir())):
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    h.update(options.encode())
    return h.hexdigest()[:20]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _writer(tmp: Path) -> tuple[int | None, list[str]]:
    """The pid of the JVM that writes ``tmp`` and its command line (None and []: not known
    yet, or not readable)."""
    try:
        pid, _, cmdline = tmp.with_suffix(".pid").read_text().partition("\n")
        return int(pid), [a for a in cmdline.split("\0") if a]
    except (OSError, ValueError):
        return None, []


def _trial(tmp: Path, cmdline: list[str]) -> bool:
    """Whether a JVM like the writer (its binary and class path) starts with ``tmp`` mapped,
    every region checked against the checksums written with it (``-Xshare:on``: a JVM that
    cannot map it exits with an error; a half-written archive must never be mapped by a
    run, where it crashes the JVM the moment a missing page is touched)."""
    if not cmdline:
        return False
    cp = next((cmdline[i + 1] for i, a in enumerate(cmdline[:-1])
               if a in ("-cp", "-classpath", "--class-path")), None)
    args = [cmdline[0], "-Xshare:on", f"-XX:SharedArchiveFile={tmp}", "-XX:+VerifySharedSpaces",
            *QUIET.split(), f"-XX:ErrorFile={tmp.with_suffix('.err')}"]
    args += ["-cp", cp] if cp else []
    try:
        done = subprocess.run([*args, "-version"], capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("cutline: the trial of class-data archive %s did not run: %s", tmp, exc)
        return False
    finally:
        _remove(tmp.with_suffix(".err"))
    if done.returncode != 0:
        log.debug("cutline: a class-data archive for Spark's JVM is refused (%s); a later run "
                 "writes a new one", (done.stdout + done.stderr).decode(errors="replace")
                 .strip().splitlines()[-1:] or done.returncode)
    return done.returncode == 0


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            p.unlink()


def _settle(folder: Path, key: str, now: float) -> tuple[Path | None, bool]:
    """The archive for ``key`` (adopting a finished temporary one), or None; and whether
    a writer is at work on one now.  A writer's marker (``KEY.ID.pid``) is there from
    before its JVM starts; the archive (``KEY.ID.tmp``) appears when that JVM exits."""
    final = folder / f"{key}.jsa"
    writing = False
    for marker in sorted(folder.glob(f"{key}.*.pid")):
        tmp = marker.with_suffix(".tmp")
        pid, cmdline = _writer(tmp)
        try:
            age = now - marker.stat().st_mtime
        except OSError:
            continue  # adopted or removed meanwhile
        if (pid is not None and _alive(pid)) or (pid is None and age < WRITER_GRACE):
            writing = True
            continue
        if not final.exists() and _starts_like_an_archive(tmp) and _trial(tmp, cmdline):
            with contextlib.suppress(OSError):
                _seal(tmp)
                os.replace(tmp, final)  # whole, in one step
        _remove(tmp, marker)
    if final.exists() and not _sealed(final):  # changed since its trial: never mapped
        log.debug("cutline: class-data archive %s changed since it was checked; removed", final)
        _remove(final, final.with_suffix(".seal"))
    return (final if final.exists() else None), writing


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def _seal(tmp: Path) -> None:
    """Note the size and time of an archive that passed its trial (``KEY.seal`` once it is
    renamed): a file changed since (cut short by a copy, a full disk) is not mapped."""
    final = tmp.with_name(tmp.name.split(".", 1)[0] + ".seal")
    final.write_text(_stamp(tmp))


def _sealed(archive: Path) -> bool:
    try:
        return archive.with_suffix(".seal").read_text().strip() == _stamp(archive)
    except OSError:
        return False


def _starts_like_an_archive(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC and os.fstat(f.fileno()).st_size > 1 << 20
    except OSError:
        return False


STALE = 3600.0
"""Seconds after which another key's temporary archive whose writer is gone is removed:
its installation's next run would have adopted it (a venv deleted since never will)."""


def _sweep(folder: Path, key: str, now: float) -> None:
    """Other keys' writers' leftovers: a temporary archive (and its marker) whose writer is
    gone and that is older than :data:`STALE`; a marker older than that without one."""
    for marker in folder.glob("*.pid"):
        if marker.name.startswith(key + "."):
            continue
        tmp = marker.with_suffix(".tmp")
        pid, _ = _writer(tmp)
        try:
            age = now - max(p.stat().st_mtime for p in (marker, tmp) if p.exists())
        except (OSError, ValueError):
            continue
        if age > STALE and (pid is None or not _alive(pid)):
            _remove(tmp, marker)


def _prune(folder: Path, keep: Path) -> None:
    """At most :data:`KEEP` archives: the least recently used others go."""
    def used(archive: Path) -> float:  # its seal is touched at each use
        try:
            return archive.with_suffix(".seal").stat().st_mtime
        except OSError:
            return 0.0

    archives = sorted(folder.glob("*.jsa"), key=used, reverse=True)
    for old in [a for a in archives if a != keep][KEEP - 1:]:
        _remove(old, old.with_suffix(".seal"))


def java_options(options: str, kind: str = "context") -> tuple[str, Path | None]:
    """``options`` (the driver JVM's own) with what maps the archive for this Java and
    Spark, or what writes it at the JVM's exit; and the path of the archive being written
    (give it to :func:`note_writer` once the JVM runs), None when mapping one or neither.

    ``kind`` names what the JVM will load (``context``, ``session``: a SparkSession loads
    SQL's classes too): each has its own archive."""
    if not _enabled():
        return options, None
    java, jars = _java(), _spark_jars()
    if java is None or jars is None:
        return options, None
    try:
        folder = archive_dir()
        folder.mkdir(parents=True, exist_ok=True)
        key = f"{kind}-{_key(java, jars, options)}"
        now = time.time()
        _sweep(folder, key, now)
        archive, writing = _settle(folder, key, now)
        if archive is not None:
            os.utime(archive.with_suffix(".seal"))  # recently used: kept by _prune
            _prune(folder, archive)
            return f"{options} -XX:SharedArchiveFile={archive} {QUIET}".strip(), None
        if writing:
            return options, None
        tmp = folder / f"{key}.{uuid.uuid4().hex[:12]}.tmp"
        tmp.with_suffix(".pid").touch()  # a writer is at work (its pid comes once known)
        return (f"{options} -XX:ArchiveClassesAtExit={tmp} -XX:+VerifySharedSpaces "
                f"{QUIET}".strip(), tmp)
    except OSError as exc:  # a cache folder we cannot write: start without one
        log.debug("cutline: no class-data archive for Spark's JVM: %s", exc)
        return options, None


def note_writer(tmp: Path | None, sc: Any) -> None:
    """The JVM of ``sc`` writes ``tmp`` when it exits: record its pid beside it, so the
    next run adopts the archive once that JVM is gone (a JVM started before, without the
    option, writes nothing: its marker goes)."""
    if tmp is None:
        return
    pid = _jvm_pid(sc)
    if pid is None:  # unknown: WRITER_GRACE decides
        return
    cmdline = _cmdline(pid)
    if cmdline is not None and not any(str(tmp) in a for a in cmdline):
        _remove(tmp.with_suffix(".pid"))
        return
    with contextlib.suppress(OSError):
        tmp.with_suffix(".pid").write_text(f"{pid}\n" + "\0".join(cmdline or []))


def _cmdline(pid: int) -> list[str] | None:
    """Process ``pid``'s command line (None: cannot be read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None


def _jvm_pid(sc: Any) -> int | None:
    try:
        return int(sc._gateway.proc.pid)  # spark-submit execs the JVM: the same process
    except Exception as exc:  # noqa: BLE001 - a session another launcher started
        log.debug("cutline: the Spark JVM's pid is not known: %s", exc)
        return None


def mapped(sc: Any, archive: Path) -> bool | None:
    """Whether the JVM of ``sc`` has mapped ``archive`` (Linux: its memory map names the
    file); None when that cannot be told."""
    pid = _jvm_pid(sc)
    cmdline = _cmdline(pid) if pid is not None else None
    if cmdline is None or not any(str(archive) in a for a in cmdline):
        return None  # not known, or a JVM started before, not asked to map it
    want = str(archive.resolve())
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(line.rstrip().endswith(want) for line in f)
    except OSError:
        return None


def note_use(options: str, sc: Any) -> None:
    """After the JVM started with ``options``: if they map an archive and the JVM did not
    (it refused it: half written, or it no longer fits), remove it, so a later run writes
    a new one."""
    if "-XX:SharedArchiveFile=" not in options:
        return
    archive = Path(options.split("-XX:SharedArchiveFile=", 1)[1].split()[0])
    if mapped(sc, archive) is False:
        log.debug("cutline: Spark's JVM did not map its class-data archive %s; a later run "
                 "writes a new one", archive)
        _remove(archive)
