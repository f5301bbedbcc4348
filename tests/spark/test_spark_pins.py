"""The installed PySpark / pyarrow pair runs the Spark features cutline is compared with.

PySpark 4.0 and 4.1 with pyarrow 26 break ``applyInPandasWithState`` (a float passed to
``RecordBatch.slice``), which bench/vs_spark.py runs; beside them, install with
``-c bench/constraints-pyspark-4.0-4.1.txt`` (``make test-spark-versions`` does).  cutline
itself needs no pin: PySpark 4.3 works with pyarrow 26.
"""

import pandas as pd
import pytest
from pyspark.sql.streaming.state import GroupStateTimeout

pytestmark = pytest.mark.slow


def count_per_key(key, frames, state):
    total = state.get[0] if state.exists else 0
    for frame in frames:
        total += len(frame)
    state.update((total,))
    yield pd.DataFrame({"k": [key[0]], "n": [total]})


def test_apply_in_pandas_with_state_on_the_installed_pair(spark, tmp_path):
    import sys

    import pyarrow
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers can't import tests
    for i in range(3):
        pd.DataFrame({"k": [f"k{j % 4}" for j in range(100)]}).to_json(
            tmp_path / f"in-{i}.json", orient="records", lines=True)
    stream = spark.readStream.schema("k string").json(str(tmp_path))
    out = stream.groupBy("k").applyInPandasWithState(
        count_per_key, "k string, n long", "n long", "update", GroupStateTimeout.NoTimeout)
    query = (out.writeStream.format("memory").queryName("pins").outputMode("update")
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True)
             .start())
    try:
        query.awaitTermination(120)
    except Exception as exc:  # noqa: BLE001 - named below
        pytest.fail(f"PySpark {spark.version} with pyarrow {pyarrow.__version__} cannot run "
                    f"applyInPandasWithState: {str(exc).splitlines()[0][:300]} (with PySpark "
                    "4.0-4.1: pip install -c bench/constraints-pyspark-4.0-4.1.txt)")
    rows = {r["k"]: r["n"] for r in spark.sql("select * from pins").collect()}
    assert rows == {"k0": 75, "k1": 75, "k2": 75, "k3": 75}
