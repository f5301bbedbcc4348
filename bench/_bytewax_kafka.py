"""``bench/kafka.py``'s job on Bytewax (0.21): Kafka -> parse JSON -> key -> running count per
key -> Kafka, with Bytewax's own Kafka connector (``bytewax.connectors.kafka``).

Run by the benchmark as ``python bench/_bytewax_kafka.py PROCESS ADDRESSES SNAPSHOT RECOVERY``
once per process (two processes of one worker, as cutline's parallelism 2; ``ADDRESSES``
"host:port;host:port"), snapshots every ``SNAPSHOT`` seconds into the recovery partitions
under ``RECOVERY`` (``python -m bytewax.recovery``): what ``python -m bytewax.testing -p 2
-r ... -s ...`` does, but with a snapshot interval under a second (its command line takes whole
seconds) and ports of our choosing.  The settings are in the environment:
``BENCH_BOOTSTRAP``, ``BENCH_IN``, ``BENCH_OUT`` (topics), ``BENCH_TAIL`` ("1": wait for new
records, the latency runs, which the benchmark ends; else stop at the end of each partition)
and ``BENCH_FIRST`` (a directory: each process writes the time it parsed its first record
there, the start of the throughput clock).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource
from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig
from bytewax.run import cli_main

BOOTSTRAP = os.environ.get("BENCH_BOOTSTRAP", "127.0.0.1:9092")
IN, OUT = os.environ.get("BENCH_IN", "in"), os.environ.get("BENCH_OUT", "out")
TAIL = os.environ.get("BENCH_TAIL") == "1"
FIRST = os.environ.get("BENCH_FIRST")
_first: list[float] = []


def parse(msg: Any) -> dict:
    if not _first:
        _first.append(time.time())
        if FIRST:
            with open(os.path.join(FIRST, f"first-{os.getpid()}"), "w") as f:
                f.write(repr(_first[0]))
    return json.loads(msg.value)


def count(n: int | None, _record: dict) -> tuple[int, int]:
    n = (n or 0) + 1
    return n, n


def message(key_count: tuple[str, int]) -> KafkaSinkMessage:
    key, n = key_count
    return KafkaSinkMessage(key.encode(), str(n).encode())


flow = Dataflow("kafka-count")
records = op.map("parse", op.input("in", flow, KafkaSource([BOOTSTRAP], [IN], tail=TAIL)),
                 parse)
counts = op.stateful_map("count", op.key_on("key", records, lambda r: r["k"]), count)
op.output("out", op.map("message", counts, message), KafkaSink([BOOTSTRAP], OUT))


if __name__ == "__main__":
    process, addresses, snapshot, recovery = sys.argv[1:5]
    cli_main(flow, workers_per_process=1, process_id=int(process),
             addresses=addresses.split(";"), epoch_interval=timedelta(seconds=float(snapshot)),
             recovery_config=RecoveryConfig(recovery, timedelta(0)))
