"""One job per storage: a running job's lease (cutline.storage.lease).

A second start of a job on the storage of a running one is refused at once, naming it; a
lease whose holder died is taken over; of several drivers starting at once exactly one wins,
on local files and on S3 (moto's server, conditional PUT); a holder whose lease was taken over
while it was silent stops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cutline.storage import lease as lease_mod
from cutline.storage.checkpoints import CheckpointStorage
from cutline.storage.lease import JobAlreadyRunningError, JobLease, check_free

ROOT = Path(__file__).resolve().parents[2]


def _storage(tmp_path: Path, job: str = "j") -> CheckpointStorage:
    return CheckpointStorage(f"file://{tmp_path}/chk", job)


def _write_lease(storage: CheckpointStorage, n: int, **body) -> str:
    path = f"{storage.dir}/_lease-{n:010d}"
    storage.fs.pipe_file(path, json.dumps(body).encode())
    return path


def test_second_start_is_refused_naming_the_running_one(tmp_path):
    st = _storage(tmp_path)
    first = JobLease(st, dashboard=lambda: "http://127.0.0.1:8081/?token=x")
    first.acquire()
    try:
        with pytest.raises(JobAlreadyRunningError) as e:
            JobLease(_storage(tmp_path)).acquire()
        msg = str(e.value)
        assert "job 'j' is already running" in msg
        assert f"run {first.run}" in msg and f"pid {os.getpid()}" in msg
        assert "dashboard http://127.0.0.1:8081/?token=x" in msg
        with pytest.raises(JobAlreadyRunningError):
            check_free(_storage(tmp_path))
        # another job on the same storage root is another lease
        other = JobLease(_storage(tmp_path, "other"))
        other.acquire()
        other.release()
    finally:
        first.release()
    again = JobLease(_storage(tmp_path))  # released: free again
    again.acquire()
    assert again.took_over is None
    again.release()
    assert not [p for p in os.listdir(tmp_path / "chk" / "j") if p.startswith("_lease")]


def test_a_stale_lease_is_taken_over(tmp_path):
    st = _storage(tmp_path)
    st.fs.makedirs(st.dir, exist_ok=True)
    old = _write_lease(st, 3, host="elsewhere", pid=1, run="r-old", started=time.time() - 100,
                       heartbeat=time.time() - lease_mod.STALE_AFTER - 5)
    check_free(st)  # stale: free
    ls = JobLease(st)
    ls.acquire()
    try:
        assert ls.n == 4
        assert "run r-old on host elsewhere" in (ls.took_over or "")
        assert "last heartbeat was" in (ls.took_over or "")
        assert not st.fs.exists(old)  # the older lease is swept
    finally:
        ls.release()


def test_a_fresh_lease_of_another_host_is_respected(tmp_path):
    st = _storage(tmp_path)
    st.fs.makedirs(st.dir, exist_ok=True)
    _write_lease(st, 1, host="elsewhere", pid=1, run="r-x", started=time.time(),
                 heartbeat=time.time() - 3)
    with pytest.raises(JobAlreadyRunningError, match="run r-x on host elsewhere pid 1"):
        JobLease(st).acquire()


def test_the_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    st = _storage(tmp_path)
    st.fs.makedirs(st.dir, exist_ok=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lease(st, 1, host=lease_mod._host(), pid=dead.pid, run="r-dead",
                 started=time.time(), heartbeat=time.time())
    ls = JobLease(st)
    ls.acquire()
    try:
        assert f"its process {dead.pid} on this host is gone" in (ls.took_over or "")
    finally:
        ls.release()


def test_a_lease_left_by_an_ended_run_of_this_process_is_taken_over(tmp_path):
    st = _storage(tmp_path)
    st.fs.makedirs(st.dir, exist_ok=True)
    _write_lease(st, 1, host=lease_mod._host(), pid=os.getpid(), run="r-ended",
                 started=time.time(), heartbeat=time.time())
    ls = JobLease(st)
    ls.acquire()
    assert "its run in this process has ended" in (ls.took_over or "")
    ls.release()


def test_a_holder_whose_lease_was_taken_over_stops(tmp_path):
    st = _storage(tmp_path)
    lost: list[str] = []
    ls = JobLease(st, on_lost=lost.append, heartbeat=0.05)
    ls.acquire()
    try:
        # what a driver that judged this one stale does: the next lease, exclusively
        _write_lease(st, ls.n + 1, host="elsewhere", pid=7, run="r-new",
                     started=time.time(), heartbeat=time.time())
        deadline = time.monotonic() + 10
        while not lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lost and "another driver took over its storage" in lost[0]
        assert "run r-new on host elsewhere" in lost[0]
    finally:
        ls.release()


def test_heartbeats_refresh_the_lease(tmp_path):
    st = _storage(tmp_path)
    ls = JobLease(st, heartbeat=0.05)
    ls.acquire()
    try:
        first = json.loads(st.fs.cat_file(ls.path))["heartbeat"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if json.loads(st.fs.cat_file(ls.path) or b"{}").get("heartbeat", 0) > first:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the lease's heartbeat never moved")
    finally:
        ls.release()


# ---------------------------------------------------------------- races between processes

_RACER = textwrap.dedent("""
    import json, sys, time
    from cutline.storage.checkpoints import CheckpointStorage
    from cutline.storage.lease import JobAlreadyRunningError, JobLease
    url, options, at = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
    storage = CheckpointStorage(url, "race", options or None)
    lease = JobLease(storage)
    time.sleep(max(0.0, at - time.time()))
    try:
        lease.acquire()
    except JobAlreadyRunningError as e:
        print("refused:", e, flush=True)
        sys.exit(0)
    print("won", flush=True)
    time.sleep(2)
    lease.release()
""")


def _race(url: str, options: dict | None, racers: int = 4) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    at = time.time() + 4  # every racer imported and ready by then
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, url, json.dumps(options), str(at)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(racers)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out.strip())
    return outs


def _check_one_winner(outs: list[str]) -> None:
    won = [o for o in outs if o == "won"]
    refused = [o for o in outs if o.startswith("refused:")]
    assert len(won) == 1 and len(refused) == len(outs) - 1, outs
    assert all("job 'race' is already running" in o for o in refused), refused


def test_of_drivers_starting_at_once_exactly_one_wins_on_local_files(tmp_path):
    _check_one_winner(_race(f"file://{tmp_path}/chk", None))


def test_of_drivers_starting_at_once_exactly_one_wins_on_s3(s3):
    _check_one_winner(_race(s3.url("lease"), s3.options))
