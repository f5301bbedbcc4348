"""Kafka -> parse -> key_by -> count -> Kafka on Spark (4 partitions in and out, parallelism
2) in the checkpoint modes :mod:`test_kafka_sink` does not run (unaligned, aligned with a
timeout that switches to unaligned, at-least-once), each with five ``kill -9`` of Python
workers, and across a ``kill -9`` of the driver process followed by a new run on the same
checkpoint storage (issue 27).  A plain (read_uncommitted) consumer of the output topic sees
every (user, count) exactly once; at-least-once: none missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.storage.checkpoints import CheckpointStorage

from kafka_util import unique_topic
from test_kafka_sink import assert_exactly_once, count_sink, expected_counts, got_counts

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent  # and TESTS.parent: the helper modules
N = 16_000


def slow_user(record):
    """A Kafka record's user, a little slowly (so kills land mid-stream)."""
    import time

    time.sleep(0.0005)
    return record.value["user"]


def kafka_counts(broker, tmp_path: Path, source_topic: str, out: str, *, delivery: str,
                 **config) -> Pipeline:
    from cutline.connectors import KafkaSource

    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk", **config)
    p = Pipeline("kafka-modes", parallelism=2, checkpoint=cfg)
    (p.source(KafkaSource(broker.bootstrap, source_topic, value_format="json",
                          stopping_offsets="latest"), uid="clicks")
     .map(slow_user, uid="parse")
     .key_by(lambda user: user).count(uid="count")
     .sink(count_sink(broker, out, delivery), uid="out"))
    return p


def topics(broker) -> tuple[str, str]:
    source_topic = broker.create_topic(unique_topic("clicks"), 4)
    out = broker.create_topic(unique_topic("user-counts"), 4)
    broker.produce(source_topic, [(f"u{i % 10}", json.dumps({"user": i % 10}))
                                  for i in range(N)])
    return source_topic, out


@pytest.mark.parametrize("mode", ["unaligned", "aligned_timeout", "at_least_once"])
def test_kafka_to_kafka_five_kills_in_every_mode(spark, kafka_broker, tmp_path, mode):
    from cutline.spark.chaos import Chaos

    source_topic, out = topics(kafka_broker)
    config = {"unaligned": {"unaligned": True},
              "aligned_timeout": {"aligned_timeout": 0.01},
              "at_least_once": {"mode": "at_least_once"}}[mode]
    delivery = "at_least_once" if mode == "at_least_once" else "exactly_once"
    p = kafka_counts(kafka_broker, tmp_path, source_topic, out, delivery=delivery, **config)
    chaos = Chaos(kills=5, seed=27, mean_delay=1.0)
    result = p.run(spark=spark, timeout=600, on_start=chaos)
    assert len(chaos.killed) == 5, chaos.killed
    assert result.attempts >= 6
    if mode == "at_least_once":  # duplicates allowed, never a loss
        assert set(got_counts(kafka_broker, out)) == set(expected_counts(N))
    else:
        assert_exactly_once(kafka_broker, out, N)


SCRIPT = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = {tests!r}
    from pathlib import Path
    from cutline.driver.shell import Driver
    from cutline.protocol import messages as m
    from cutline.protocol.job import Send
    from cutline.spark.launcher import embedded_session
    from types import SimpleNamespace
    from test_kafka_modes import kafka_counts

    original = Driver._perform

    def perform(self, commands):
        # die the moment checkpoint 3 is complete in storage, before any sink commits it
        for cmd in commands:
            if type(cmd) is Send and type(cmd.msg) is m.Complete and cmd.msg.checkpoint >= 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, commands)

    Driver._perform = perform
    broker = SimpleNamespace(bootstrap={bootstrap!r})  # (the test's broker)
    p = kafka_counts(broker, Path({tmp!r}), {source!r}, {out!r}, delivery="exactly_once")
    p.run(spark=embedded_session(2))
    print("the driver was not killed")
""")


def test_a_new_run_after_the_driver_died_commits_kafka_output_exactly_once(
        spark, kafka_broker, tmp_path):
    """The driver dies (``kill -9``) the moment checkpoint 3 is complete, before it tells
    the sink to produce that checkpoint's records; a new run on the same storage restores
    it, produces them (once) and goes on: the output topic holds every count once."""
    source_topic, out = topics(kafka_broker)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(tests=[str(TESTS), str(TESTS.parent)], tmp=str(tmp_path),
                                    source=source_topic, out=out,
                                    bootstrap=kafka_broker.bootstrap))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == -9, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    latest = CheckpointStorage(f"file://{tmp_path}/chk", "kafka-modes").latest()
    assert latest is not None and latest.id >= 3
    before = sum(got_counts(kafka_broker, out).values())
    assert before < N, "the dead run wrote everything: the kill came too late"
    p = kafka_counts(kafka_broker, tmp_path, source_topic, out, delivery="exactly_once")
    result = p.run(spark=spark, timeout=300)
    assert result.restored_from == latest.path
    assert_exactly_once(kafka_broker, out, N)
