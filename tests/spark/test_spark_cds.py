"""cutline.spark.cds: the class-data archive of the embedded Spark's JVM.  Which archive a
start maps, writes or leaves alone is decided from files alone (tested here as data, with
processes for writers); tests/spark/test_spark_cds_runs.py starts real JVMs with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutline.spark import cds


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(cds.ENV_DIR, str(tmp_path / "cds"))
    monkeypatch.delenv(cds.ENV_OFF, raising=False)
    return tmp_path / "cds"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _written(tmp: Path, pid: int, body: bytes = cds.MAGIC + bytes(2 << 20)) -> None:
    """The writer of ``tmp`` said its pid (note_writer) and its JVM wrote the archive."""
    tmp.write_bytes(body)
    tmp.with_suffix(".pid").write_text(f"{pid}\n/usr/bin/java\0-cp\0x.jar")


def test_a_start_with_no_archive_writes_one_and_no_other_start_does_meanwhile(folder):
    options, tmp = cds.java_options("-XX:TieredStopAtLevel=1")
    assert tmp is not None and f"-XX:ArchiveClassesAtExit={tmp}" in options
    assert options.startswith("-XX:TieredStopAtLevel=1 ") and "-Xlog:cds=off" in options
    assert tmp.with_suffix(".pid").exists()  # the writer's marker, before its JVM starts
    again, other = cds.java_options("-XX:TieredStopAtLevel=1")
    assert (again, other) == ("-XX:TieredStopAtLevel=1", None)  # one writer at a time
    # a marker whose writer never said its pid counts as writing for WRITER_GRACE only
    old = time.time() - cds.WRITER_GRACE - 1
    os.utime(tmp.with_suffix(".pid"), (old, old))
    third, tmp3 = cds.java_options("-XX:TieredStopAtLevel=1")
    assert tmp3 is not None and tmp3 != tmp and not tmp.with_suffix(".pid").exists()


def test_a_finished_archive_that_passes_its_trial_is_adopted_and_mapped(folder, monkeypatch):
    trials = []
    monkeypatch.setattr(cds, "_trial", lambda tmp, cmd: trials.append(cmd) or True)
    options, tmp = cds.java_options("-Xss4m")
    assert tmp is not None
    key = tmp.name.split(".", 1)[0]
    _written(tmp, os.getpid())  # its JVM still runs (writing): left alone
    assert cds.java_options("-Xss4m") == ("-Xss4m", None) and trials == []
    _written(tmp, _dead_pid())  # gone: tried, adopted
    options, tmp = cds.java_options("-Xss4m")
    assert tmp is None and trials == [["/usr/bin/java", "-cp", "x.jar"]]
    assert options == (f"-Xss4m -XX:SharedArchiveFile={folder / (key + '.jsa')} "
                       f"{cds.QUIET}")
    assert sorted(p.name for p in folder.iterdir()) == [f"{key}.jsa", f"{key}.seal"]


@pytest.mark.parametrize("body, trial", [(cds.MAGIC + bytes(2 << 20), False),
                                         (b"\0" * (2 << 20), True),  # not an archive
                                         (cds.MAGIC + bytes(100), True)])  # cut short
def test_an_archive_that_fails_its_checks_is_removed_and_written_again(folder, monkeypatch,
                                                                        body, trial):
    monkeypatch.setattr(cds, "_trial", lambda tmp, cmd: trial)
    _, tmp = cds.java_options("")
    key = tmp.name.split(".", 1)[0]
    _written(tmp, _dead_pid(), body)
    options, again = cds.java_options("")
    assert again is not None and "-XX:ArchiveClassesAtExit" in options  # a new writer
    assert not (folder / f"{key}.jsa").exists()
    assert sorted(p.name for p in folder.iterdir()) == [again.with_suffix(".pid").name]


def test_an_archive_changed_after_its_trial_is_never_mapped(folder, monkeypatch):
    monkeypatch.setattr(cds, "_trial", lambda tmp, cmd: True)
    _, tmp = cds.java_options("")
    key = tmp.name.split(".", 1)[0]
    _written(tmp, _dead_pid())
    options, _ = cds.java_options("")
    archive = folder / f"{key}.jsa"
    assert "SharedArchiveFile" in options
    with open(archive, "r+b") as f:  # cut short by a copy or a full disk
        f.truncate(1 << 20)
    options, tmp = cds.java_options("")
    assert "SharedArchiveFile" not in options and not archive.exists()


def test_the_trial_refuses_what_a_jvm_cannot_map(tmp_path):
    """A real JVM: an archive that is not one fails its trial (no crash file left)."""
    java = cds._java()
    if java is None:
        pytest.skip("no java")
    bad = tmp_path / "k.x.tmp"
    bad.write_bytes(cds.MAGIC + os.urandom(2 << 20))
    assert cds._trial(bad, [str(java), "-cp", str(tmp_path)]) is False
    assert cds._trial(bad, []) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.x.tmp"]


def test_off_by_environment_or_an_unwritable_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(cds.ENV_OFF, "0")
    monkeypatch.setenv(cds.ENV_DIR, str(tmp_path / "cds"))
    assert cds.java_options("-Xss4m") == ("-Xss4m", None)
    assert not (tmp_path / "cds").exists()
    monkeypatch.delenv(cds.ENV_OFF)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cds.ENV_DIR, str(tmp_path / "file" / "cds"))  # under a regular file
    assert cds.java_options("-Xss4m") == ("-Xss4m", None)


def test_the_least_recently_used_archives_go_beyond_keep(folder):
    folder.mkdir(parents=True)
    for k in range(cds.KEEP + 2):
        archive = folder / f"k{k}.jsa"
        archive.write_bytes(b"x")
        archive.with_suffix(".seal").write_text(cds._stamp(archive))
        os.utime(archive.with_suffix(".seal"), (1000 + k, 1000 + k))
    cds._prune(folder, folder / "k0.jsa")
    kept = sorted(p.name for p in folder.glob("*.jsa"))
    assert kept == ["k0.jsa", *[f"k{k}.jsa" for k in range(cds.KEEP + 2)][-(cds.KEEP - 1):]]
    assert len(list(folder.glob("*.seal"))) == cds.KEEP


def test_off_where_a_writer_cannot_be_told(folder, monkeypatch):
    """Without /proc (not Linux) no archive would ever be adopted: none is written."""
    monkeypatch.setattr(cds.sys, "platform", "darwin")
    assert cds.java_options("-Xss4m") == ("-Xss4m", None)
    assert not folder.exists()


def test_other_installations_leftovers_go_once_stale(folder):
    """A temporary archive of another key (a venv deleted since) whose writer is gone is
    removed after STALE; one whose writer lives, or a recent one, stays."""
    folder.mkdir(parents=True)
    old = time.time() - cds.STALE - 10
    dead, live = _dead_pid(), os.getpid()
    for name, pid, when in (("gone", dead, old), ("alive", live, old), ("recent", dead, None)):
        tmp = folder / f"other-{name}.x.tmp"
        _written(tmp, pid)
        if when is not None:
            for p in (tmp, tmp.with_suffix(".pid")):
                os.utime(p, (when, when))
    cds.java_options("")
    left = sorted(p.name for p in folder.iterdir() if p.name.startswith("other-"))
    assert left == ["other-alive.x.pid", "other-alive.x.tmp", "other-recent.x.pid",
                    "other-recent.x.tmp"]
