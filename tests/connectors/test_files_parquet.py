"""Files in, Parquet out, exactly once: a keyed running total with value and list state."""

import collections

import pyarrow.parquet as pq
import pytest

from cutline.spark.faults import Kill
from pipelines import clicks, expected_clicks, write_events


def read_output(sink):
    rows = []
    for f in sink.committed_files():
        rows += pq.read_table(f).to_pylist()
    return rows


def check(rows, events):
    kept_ids = sorted(e["id"] for e in events if e["ms"] >= 10)
    assert sorted(r["id"] for r in rows) == kept_ids  # every record once
    assert collections.Counter((r["user"], r["n"]) for r in rows) == expected_clicks(events)
    # the final total per user is the sum of its kept events
    final = {}
    for r in rows:
        if r["n"] > final.get(r["user"], (0, 0))[0]:
            final[r["user"]] = (r["n"], r["total"])
    sums = collections.Counter()
    for e in events:
        if e["ms"] >= 10:
            sums[e["user"]] += e["ms"]
    assert {u: t for u, (_, t) in final.items()} == dict(sums)


def test_files_to_parquet_on_threads(tmp_path):
    events = write_events(tmp_path / "in", files=3, per_file=1500)
    p, sink = clicks(tmp_path)
    p.run(engine="threads", timeout=120)
    check(read_output(sink), events)


@pytest.mark.slow
def test_files_to_parquet_survives_kill_9_on_spark(spark, tmp_path):
    events = write_events(tmp_path / "in", files=4, per_file=4000)
    p, sink = clicks(tmp_path)
    kill = Kill(after_checkpoint=1, delay=0.2)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed and result.attempts >= 2
    check(read_output(sink), events)


def test_malformed_record_fails_the_job_naming_file_and_line(tmp_path):
    from cutline.driver.dataflow import JobFailed

    write_events(tmp_path / "in", files=1, per_file=10)
    with open(tmp_path / "in" / "events-000.jsonl", "a") as f:
        f.write("{not json\n")
    p, _ = clicks(tmp_path)
    with pytest.raises(JobFailed, match=r"events-000\.jsonl.*line 11"):
        p.run(engine="threads", timeout=60)
