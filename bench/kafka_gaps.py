"""Tansu's fetch gaps, reproduced: ``producers`` threads write the same 4 partitions at a
paced rate while a consumer tails the topic; afterwards a new consumer reads the topic
again.  A record the tailing consumer missed but the new one finds was skipped by a fetch
at the end of the log (Tansu 0.6 advances a partition's high watermark before it stores
the batch, so a fetch in between is answered with a later producer's batch alone).

    python bench/kafka_gaps.py --trials 10 --producers 2            # a plain consumer
    python bench/kafka_gaps.py --trials 10 --producers 4 --reader kafka_source
    python bench/kafka_gaps.py --trials 100 --watermarks

``--watermarks``: no tailing reader; the producers write 1,500 records each as fast as they
can, then each partition's watermarks (ListOffsets) are compared with what a read from
offset 0 finds.  Tansu 0.6 now and then answers the earliest offset wrongly for good (a low
watermark of 1 and an earliest of 375 for a partition holding offsets 0..749), so a reader
that starts from the earliest offset ListOffsets names misses records the topic holds.

``--reader plain``: a ``confluent-kafka`` consumer (the settings of ``bench/kafka.py``'s
live watcher before it fetched gaps again); ``kafka_source``: cutline's ``KafkaSource``
reader (``--gap-recheck 0``: with its re-fetch of gaps off).  Prints each trial and the
number of trials with records missed; exit status 1 if any.  Not a benchmark: nothing is
timed; docs/kafka.md ("Gaps in a partition's offsets") has the numbers measured with it.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from kafka_util import create_topic, read_topic, start_broker  # noqa: E402

PARTITIONS = 4


def produce(bootstrap: str, topic: str, j: int, n: int, rate: float,
            shift: bool = False) -> None:
    """Producer ``j``: ``n`` records at ``rate``/s, record ``i`` to partition ``i % 4``
    (``shift``: ``(i + j) % 4``, so the producers write different partitions at a time)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5})
    t0, i = time.time(), 0
    while i < n:
        due = min(n, int((time.time() - t0) * rate) + 1)
        while i < due:
            p.produce(topic, value=f"{j}-{i}".encode(), key=b"k",
                      partition=(i + j * shift) % PARTITIONS)
            i += 1
        p.poll(0)
        time.sleep(0.002)
    if p.flush(60):
        raise RuntimeError("not all acknowledged")


def tail_plain(bootstrap: str, topic: str, halt: threading.Event, seen: list) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "gaps",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    c.assign([TopicPartition(topic, q, 0) for q in range(PARTITIONS)])
    while not halt.is_set():
        seen.extend(m.value() for m in c.consume(1000, 0.02) if m.error() is None)
    c.close()


def tail_source(bootstrap: str, topic: str, halt: threading.Event, seen: list,
                stops: dict, gap_recheck: float, counts: dict) -> None:
    from cutline.connectors import KafkaSource

    r = KafkaSource(bootstrap, topic, stopping_offsets={topic: stops},
                    gap_recheck=gap_recheck).create_reader()
    r.open(0, 1)
    while not halt.is_set():
        batch = r.read_batch(500)
        if batch is None:
            break
        seen.extend(rec.value for rec in batch)
    counts.update(refetched=r.gaps_refetched, skipped=r.offsets_skipped)
    r.close()


def trial(bootstrap: str, args: argparse.Namespace) -> tuple[int, int, int, dict]:
    """(records produced, missed by the tailing reader, missing from the topic, counts)."""
    topic = create_topic(bootstrap, f"gaps-{uuid.uuid4().hex[:8]}", PARTITIONS)
    per = int(args.rate * args.seconds / args.producers)
    want = {f"{j}-{i}".encode() for j in range(args.producers) for i in range(per)}
    stops = {q: args.producers * len(range(q, per, PARTITIONS)) for q in range(PARTITIONS)}
    seen: list = []
    counts: dict = {}
    halt = threading.Event()
    if args.reader == "plain":
        reader = threading.Thread(target=tail_plain, args=(bootstrap, topic, halt, seen))
    else:
        reader = threading.Thread(target=tail_source, args=(
            bootstrap, topic, halt, seen, stops, args.gap_recheck, counts))
    reader.start()
    writers = [threading.Thread(target=produce, args=(bootstrap, topic, j, per,
                                                      args.rate / args.producers))
               for j in range(args.producers)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    if args.reader == "plain":
        time.sleep(1.0)
        halt.set()
    reader.join(args.seconds + 60)
    halt.set()
    stored = {m.value for m in read_topic(bootstrap, topic, timeout=60)}
    return len(want), len(want - set(seen)), len(want - stored), counts


def watermark_trial(bootstrap: str, args: argparse.Namespace) -> tuple[int, dict]:
    """(records produced, partition -> (low watermark, ListOffsets(earliest), offsets read
    from 0)) where either disagrees with the first record a fetch from offset 0 finds.
    (The high watermark is not compared: Tansu 0.6 always answers the last batch's base
    offset + 1 there, which the readers know.)"""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    topic = create_topic(bootstrap, f"marks-{uuid.uuid4().hex[:8]}", PARTITIONS)
    per = 1500
    writers = [threading.Thread(target=produce, args=(bootstrap, topic, j, per, 1e9, True))
               for j in range(args.producers)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    found: dict[int, list[int]] = {q: [] for q in range(PARTITIONS)}
    for m in read_topic(bootstrap, topic, timeout=60):
        found[m.partition].append(m.offset)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = admin.list_offsets({TopicPartition(topic, q): OffsetSpec.earliest()
                                for q in range(PARTITIONS)}, request_timeout=10)
    earliest = {tp.partition: f.result().offset for tp, f in asked.items()}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "marks"})
    try:
        wrong = {}
        for q, offs in found.items():
            lo, _hi = c.get_watermark_offsets(TopicPartition(topic, q), timeout=10)
            if offs and (lo != min(offs) or earliest[q] != min(offs)):
                wrong[q] = (lo, earliest[q], f"{min(offs)}..{max(offs)}")
    finally:
        c.close()
    return args.producers * per, wrong


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=2000.0, help="records/s, all producers")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--reader", choices=("plain", "kafka_source"), default="plain")
    ap.add_argument("--gap-recheck", type=float, default=0.2)
    ap.add_argument("--watermarks", action="store_true",
                    help="check ListOffsets' watermarks against a read from offset 0")
    args = ap.parse_args(argv)
    broker = start_broker()
    bad = 0
    try:
        for t in range(args.trials):
            if args.watermarks:
                n, wrong = watermark_trial(broker.bootstrap, args)
                bad += bool(wrong)
                if wrong:
                    print(f"trial {t}: {n} records; partition -> (low watermark, earliest, "
                          f"offsets read from 0): {wrong}", flush=True)
                continue
            n, missed, lost, counts = trial(broker.bootstrap, args)
            bad += missed > 0
            print(f"trial {t}: {n} records, missed by the tailing reader {missed}, missing "
                  f"from the topic {lost}{' ' + str(counts) if counts else ''}", flush=True)
    finally:
        broker.stop()
    what = "had wrong watermarks" if args.watermarks else "missed records"
    print(f"{bad} of {args.trials} trials {what} ({args.producers} producers"
          f"{'' if args.watermarks else ', reader ' + args.reader})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
