"""Windows on real Spark: Spark Structured Streaming as the oracle for window counts."""

import json
import os

import pytest

from cutline import CheckpointConfig, Pipeline, sliding, tumbling
from cutline.connectors import CollectSink, FileSource


pytestmark = pytest.mark.slow

KEYS, DELAY, FILES, PER_FILE = 7, 40, 4, 2_500
SENTINEL = 10**7


def write_input(directory) -> None:
    """JSON lines, out of order by less than DELAY s within and across files (so no record
    is late, in Spark or cutline), then a far-future sentinel in a file of its own (so Spark's
    watermark passes every real window)."""
    directory.mkdir(parents=True)
    names = []
    for f in range(FILES):
        name = directory / f"part-{f}.jsonl"
        with open(name, "w") as out:
            for i in range(f * PER_FILE, (f + 1) * PER_FILE):
                ts = 1_700_000_000 + i - (i * 7919) % DELAY
                out.write(json.dumps({"k": f"k{(i * 3) % KEYS}", "t": ts, "i": i}) + "\n")
        names.append(name)
    name = directory / "part-9-sentinel.jsonl"
    name.write_text(json.dumps({"k": "sentinel", "t": 1_700_000_000 + SENTINEL, "i": -1}) + "\n")
    names.append(name)
    for n, name in enumerate(names):  # Spark reads the oldest file first
        os.utime(name, (1_700_000_000 + n, 1_700_000_000 + n))


def spark_counts(spark, directory, chk, size, slide):
    """Spark's ``withWatermark(...).groupBy(window(...), key).count()`` in append mode, one
    file per micro-batch: {(key, start, end): count} of the windows it emitted."""
    from pyspark.sql import functions as F

    w = (F.window("ts", f"{size} seconds") if slide is None
         else F.window("ts", f"{size} seconds", f"{slide} seconds"))
    df = (spark.readStream.schema("k STRING, t LONG, i LONG")
          .option("maxFilesPerTrigger", 1).json(str(directory))
          .withColumn("ts", F.col("t").cast("timestamp"))
          .withWatermark("ts", f"{DELAY} seconds")
          .groupBy(w, "k").count()
          .select("k", F.col("window.start").cast("long").alias("start"),
                  F.col("window.end").cast("long").alias("end"), "count"))
    name = f"windows_{size}_{slide or 0}"
    q = (df.writeStream.format("memory").queryName(name).outputMode("append")
         .option("checkpointLocation", str(chk)).trigger(availableNow=True).start())
    q.awaitTermination()
    rows = spark.sql(f"select * from {name}").collect()
    spark.catalog.dropTempView(name)
    return {(r["k"], r["start"], r["end"]): r["count"] for r in rows}


@pytest.mark.parametrize("size, slide", [(100, None), (60, 20)])
def test_window_counts_equal_spark_structured_streaming(spark, tmp_path, size, slide):
    write_input(tmp_path / "in")
    want = spark_counts(spark, tmp_path / "in", tmp_path / "spark-chk", size, slide)
    assigner = tumbling(size) if slide is None else sliding(size, slide)
    cfg = CheckpointConfig(interval=0.5, storage=f"file://{tmp_path}/checkpoints")
    p = Pipeline("oracle", parallelism=2, checkpoint=cfg)
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(FileSource(str(tmp_path / "in"), format="jsonl"), uid="files")
      .assign_timestamps(lambda e: e["t"], max_delay=DELAY, uid="stamps")
      .key_by(lambda e: e["k"])
      .window(assigner).count(uid="counts")
      .sink(sink, uid="out"))
    p.run(spark=spark, timeout=240)
    got = {(r.key, r.start, r.end): r.value for r in sink.results()}
    assert len(got) == len(sink.results())  # one result per key and window
    # Spark emitted every window but the sentinel's (its watermark never passes that one)
    assert {w for w in got if w[0] != "sentinel"} == set(want)
    assert len(want) > 200
    assert {w: got[w] for w in want} == want
    assert sum(want.values()) == FILES * PER_FILE * (size // (slide or size))


# kill -9 of windows with late output: tests/runtime/test_event_time_spark.py (every exactly-once
# mode, both backends, row for row against a failure-free run).
