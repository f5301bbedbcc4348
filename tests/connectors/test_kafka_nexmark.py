"""Nexmark q0, q5 and q7 reading their events from Kafka (Tansu) give the same rows as the
same queries reading them from the generator (``NexmarkSource``): the code of
``bench/kafka.py``'s Nexmark section, on the threads engine, on a small input.

The events go into a topic of 4 partitions as JSON (event i in partition i % 4); the
Kafka-sourced job reads them with ``KafkaSource(value_format="json")`` whose records are the
decoded values (``ValuesOf``), so ``assign_timestamps`` right after the source keeps a
watermark per partition: no event is late, every window is complete.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")

BENCH = Path(__file__).resolve().parents[2] / "bench"
EVENTS, EVENTS_PER_SECOND, OUT_OF_ORDER = 4_000, 100.0, 20  # 40 s of event time


def _bench():
    if "bench_kafka" not in sys.modules:
        sys.path.insert(0, str(BENCH))  # its _common
        spec = importlib.util.spec_from_file_location("bench_kafka", BENCH / "kafka.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["bench_kafka"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["bench_kafka"]


@pytest.mark.slow
def test_nexmark_q0_q5_q7_from_kafka_equal_the_generator(kafka_broker):
    bk = _bench()
    ctx = {"bootstrap": kafka_broker.bootstrap, "engine": "threads"}
    bk.nexmark_setup(ctx, EVENTS, EVENTS_PER_SECOND, OUT_OF_ORDER)
    try:
        for query, least in (("q0", EVENTS * 46 // 50), ("q5", 10), ("q7", 3)):
            generator = bk.nexmark_case(ctx, query, "generator")
            kafka = bk.nexmark_case(ctx, query, "kafka")  # raises Mismatch unless equal
            reference = ctx["nexmark"]["rows"][query]
            assert kafka["rows"] == generator["rows"] == sum(reference.values()), query
            assert generator["rows"] >= least, (query, generator)
            if query == "q0":  # every bid, once
                assert generator["rows"] == EVENTS * 46 // 50
    finally:
        bk.delete_topic(ctx, ctx["nexmark"]["topic"])


@pytest.mark.slow
def test_a_differing_row_fails_the_kafka_run(kafka_broker):
    """The check itself: a Kafka-sourced run whose rows differ from the reference fails."""
    bk = _bench()
    ctx = {"bootstrap": kafka_broker.bootstrap, "engine": "threads"}
    bk.nexmark_setup(ctx, 1_000, EVENTS_PER_SECOND, OUT_OF_ORDER)
    try:
        bk.nexmark_case(ctx, "q0", "generator")
        ctx["nexmark"]["rows"]["q0"][("not", "a", "row")] += 1
        with pytest.raises(bk.Mismatch, match="fewer than the generator's"):
            bk.nexmark_case(ctx, "q0", "kafka")
    finally:
        bk.delete_topic(ctx, ctx["nexmark"]["topic"])
