"""The pinned PySpark / pyarrow pair works for the Spark features cutline is compared with.

PySpark 4.0.1 with pyarrow 26 broke ``applyInPandasWithState`` (a float passed to
``RecordBatch.slice``); this runs it on the pinned pair.
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


def test_apply_in_pandas_with_state_on_the_pinned_pair(spark, tmp_path):
    import sys

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
    query.awaitTermination(120)
    rows = {r["k"]: r["n"] for r in spark.sql("select * from pins").collect()}
    assert rows == {"k0": 75, "k1": 75, "k2": 75, "k3": 75}
