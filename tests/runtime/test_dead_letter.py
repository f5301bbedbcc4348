"""Bad records: a user function raising on a record fails the job naming operator, record and
position; with a dead-letter sink the job keeps running and every bad record is stored exactly
once (through the sink's two-phase commit) with the operator uid, error and traceback."""

import collections

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource
from cutline.driver.dataflow import JobFailed

USERS = 7


def event(i: int) -> dict:
    return {"i": i, "user": f"u{i % USERS}", "ms": "oops" if i % 101 == 17 else str(i % 500)}


def parse(e: dict) -> dict:
    return {"i": e["i"], "user": e["user"], "ms": int(e["ms"])}  # ValueError on "oops"


def check(user_count: tuple) -> bool:
    if user_count[1] % 50 == 7:
        raise ZeroDivisionError(f"count {user_count[1]} of {user_count[0]} is unlucky")
    return True


def pipeline(tmp, records, *, dead_letter=True, rate=None, name="bad", on_error=None,
             interval=0.3):
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints")
    dlq = CollectSink(str(tmp / "dead")) if dead_letter else None
    p = Pipeline(name, parallelism=2, checkpoint=cfg, dead_letter=dlq)
    out = CollectSink(str(tmp / "out"))
    (p.source(GeneratorSource(count=records, fn=event, rate=rate), uid="events")
       .map(parse, uid="parse", on_error=on_error)    # chained to the source
       .key_by(lambda e: e["user"])
       .count(uid="count")
       .filter(check, uid="check")                    # chained to count: input channels
       .sink(out, uid="out"))
    return p, out, dlq


def expected(records):
    good = [event(i) for i in range(records) if event(i)["ms"] != "oops"]
    per_user = collections.Counter(e["user"] for e in good)
    counts = [(u, n) for u, total in per_user.items() for n in range(1, total + 1)]
    out = collections.Counter(c for c in counts if c[1] % 50 != 7)
    bad = {"parse": sorted(event(i)["i"] for i in range(records) if event(i)["ms"] == "oops"),
           "check": sorted(c for c in counts if c[1] % 50 == 7)}
    return out, bad


def check_dead_letters(dlq, bad):
    letters = dlq.results()
    by_op = collections.defaultdict(list)
    for d in letters:
        by_op[d["operator"]].append(d)
    assert sorted(d["record"]["i"] for d in by_op["parse"]) == bad["parse"]  # once each
    assert sorted(d["record"] for d in by_op["check"]) == bad["check"]
    assert set(by_op) == {"parse", "check"}
    p = by_op["parse"][0]
    assert p["kind"] == "map" and type(p["kind"]) is str and p["error_type"] == "ValueError"
    assert "invalid literal for int()" in p["error"]
    assert "in parse" in p["traceback"] and "ValueError" in p["traceback"]
    assert p["task"].startswith("events.") and "source 'events' subtask" in p["position"]
    c = by_op["check"][0]
    assert c["kind"] == "filter" and c["error_type"] == "ZeroDivisionError"
    assert "is unlucky" in c["error"] and "in check" in c["traceback"]
    assert "input channel 'events." in c["position"] and "->count." in c["position"]
    assert "in its batch" in c["position"]


# ---------------------------------------------------------------------------- API

def test_dead_letter_api_is_validated(tmp_path):
    p = Pipeline("api")
    s = p.source(GeneratorSource(count=1), uid="src")
    with pytest.raises(ValueError, match=r"on_error='dead_letter'\) needs a dead-letter sink"):
        s.map(str, on_error="dead_letter")
    with pytest.raises(ValueError, match="must be 'fail' or 'dead_letter'"):
        s.filter(bool, on_error="ignore")
    with pytest.raises(TypeError, match="dead_letter must be a cutline sink"):
        Pipeline("api", dead_letter="/tmp/dead")
    sink = CollectSink(str(tmp_path / "o"))
    p = Pipeline("api", dead_letter=sink)
    p.source(GeneratorSource(count=1)).map(str).sink(sink)
    with pytest.raises(ValueError, match="the dead-letter sink writes where sink"):
        p.validate()


def test_on_error_defaults_to_the_pipelines_dead_letter_sink(tmp_path):
    p = Pipeline("api", dead_letter=CollectSink(str(tmp_path / "d")))
    s = p.source(GeneratorSource(count=1))
    assert s.map(str).node.on_error == "dead_letter"
    assert s.flat_map(list, on_error="fail").node.on_error == "fail"
    assert Pipeline("x").source(GeneratorSource(count=1)).map(str).node.on_error == "fail"


# ---------------------------------------------------------------------------- threads engine

def test_without_a_dead_letter_sink_the_error_names_operator_record_and_channel(tmp_path):
    p, _, _ = pipeline(tmp_path, 2_000, dead_letter=False)
    p.nodes[1].fn = lambda e: e  # let every record through parse: fail in check
    with pytest.raises(JobFailed, match=r"filter operator 'check' failed on record \('u\d', 7\): "
                                        r"ZeroDivisionError: count 7 of u\d is unlucky \(at "
                                        r"record \d+ of \d+ in its batch, input channel "
                                        r"'events\.\d->count\.\d' of task count\.\d\)"):
        p.run(engine="threads", timeout=60)


def test_operators_can_opt_out_of_dead_letters(tmp_path):
    p, _, dlq = pipeline(tmp_path, 500, on_error="fail")
    with pytest.raises(JobFailed, match=r"map operator 'parse' failed on record \{'i': \d+, "
                                        r"'user': 'u\d', 'ms': 'oops'\}"):
        p.run(engine="threads", timeout=60)


def test_dead_letters_are_exact_across_a_cancel_and_resume(tmp_path):
    from cutline.spark.launcher import JobCancelled

    records = 30_000
    p, _, _ = pipeline(tmp_path, records, rate=10_000)
    with pytest.raises(JobCancelled):
        p.run(engine="threads", timeout=1.5)
    p2, out, dlq = pipeline(tmp_path, records)
    result = p2.run(engine="threads", timeout=60)
    assert result.restored_from is not None
    want_out, bad = expected(records)
    assert collections.Counter(out.results()) == want_out
    check_dead_letters(dlq, bad)


# ---------------------------------------------------------------------------- on Spark

@pytest.mark.slow
def test_bad_record_fails_the_job_on_spark_naming_it(spark, tmp_path):
    p, _, _ = pipeline(tmp_path, 5_000, dead_letter=False)
    with pytest.raises(JobFailed) as info:
        p.run(spark=spark, timeout=120)
    import re

    msg = str(info.value)
    m = re.search(r"map operator 'parse' failed on record \{'i': (\d+), 'user': 'u\d', "
                  r"'ms': 'oops'\}: ValueError: invalid literal for int\(\) with base 10: "
                  r"'oops' \(at record (\d+) of (\d+) in its batch, source 'events' subtask "
                  r"(\d), generated record (\d+) \(fn's argument\)\) \(raised in parse at "
                  r"\S+test_dead_letter\.py:\d+\)", msg)
    assert m, msg
    assert int(m.group(1)) % 101 == 17 and int(m.group(2)) < int(m.group(3))
    assert m.group(5) == m.group(1)  # the record's own position, not its batch's


@pytest.mark.slow
def test_dead_letters_are_exact_under_kill_9_on_spark(spark, tmp_path):
    records = 20_000
    p, out, dlq = pipeline(tmp_path, records, rate=8_000)
    # SIGKILL slot 1 (events.1, count.1 -> check -> out.1) once checkpoint 2 completed, before
    # its sinks commit: the restarted subtasks re-commit both outputs and dead letters.
    result = p.run(spark=spark, timeout=240, faults=(("before_commit", 1, 2),))
    assert result.attempts >= 2, "the fault never fired"
    want_out, bad = expected(records)
    assert collections.Counter(out.results()) == want_out
    check_dead_letters(dlq, bad)
