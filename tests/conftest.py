import os
import sys
from collections import Counter
from pathlib import Path

import pytest

# `make test` runs the suite on two pytest-xdist workers, one test file at a time each
# (`--dist loadfile`: a module's shared failure-free run stays in one process), in collection
# order (`--no-loadscope-reorder`).  The longest files go first so that neither worker is
# left with one of them at the end while the other idles.
LONGEST_FIRST = (
    "test_cluster.py", "test_bench_vs_spark_smoke.py", "test_nexmark_queries.py",
    "test_bench_ab_smoke.py", "test_explore_time.py", "test_failures.py",
    "test_bench_runtime_smoke.py", "test_chaos.py", "test_event_time_spark.py",
    "test_columnar_spark.py", "test_tls.py", "test_net_faults_spark.py", "test_docs.py",
    "test_cluster_daemon.py", "test_driver_death.py", "test_net_faults.py",
    "test_kafka_sink.py", "test_kafka_pipelines.py", "test_aligned_splits.py",
    "test_kafka_source.py", "test_continue_finished.py", "test_late_visibility.py",
)


# Files whose tests start Spark without taking the `spark` fixture: they run a pipeline on
# the default engine (an embedded session of their own), or a script, a cluster or a
# `cutline` command that does.  With the fixture's, they are marked `spark`: `make test-fast`
# (-m "not spark", CUTLINE_TEST_NO_SPARK=1) runs the others, and there any SparkSession a test
# starts in the pytest process fails it, saying it needs the mark (listed here).
SPARK_FILES = (
    "test_bench_ab_smoke.py", "test_bench_kafka_smoke.py", "test_bench_nexmark_smoke.py",
    "test_bench_runtime_smoke.py", "test_bench_scale_smoke.py", "test_bench_smoke.py",
    "test_bench_vs_spark_smoke.py", "test_cluster.py", "test_cluster_daemon.py",
    "test_cluster_python.py", "test_cluster_soak.py", "test_cluster_watchdog.py",
    "test_docs.py",  # the README's and docs' snippets run pipelines on embedded Spark
)

# Per-test time limits (pytest-timeout; the default, 300 s, is in pyproject.toml) of the tests
# that take longer: the quick runs of the benchmarks (each several engines side by side; up
# to 451 s seen on a loaded 2-core machine) and the Nexmark queries' module fixture (Spark
# Structured Streaming's runs, 110 s seen).  A limit covers a test's fixtures' set-up.
LONG_TIMEOUTS = {
    "test_bench_vs_spark_smoke.py": 1200, "test_bench_nexmark_smoke.py": 900,
    "test_bench_ab_smoke.py": 900, "test_bench_runtime_smoke.py": 900,
    "test_bench_kafka_smoke.py": 900, "test_bench_smoke.py": 900,
    "test_bench_state_smoke.py": 900, "test_nexmark_queries.py": 600,
    # kill tests whose own run timeouts are longer than the default
    "test_kafka_modes.py": 900, "test_user_session.py": 600,
}


# The lists above name test files by basename (the tests live in folders that mirror
# src/cutline; every basename is unique, as pytest's default import mode needs without
# __init__.py files): a file renamed or removed must not silently drop out of a list.
_BASENAMES = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
_TWICE = sorted(name for name, n in _BASENAMES.items() if n > 1)
assert not _TWICE, f"test files share a basename (tests/conftest.py matches by it): {_TWICE}"
_UNKNOWN = sorted({*LONGEST_FIRST, *SPARK_FILES, *LONG_TIMEOUTS} - set(_BASENAMES))
assert not _UNKNOWN, f"tests/conftest.py lists test files that do not exist: {_UNKNOWN}"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks added here
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept
    for item in items:
        if "spark" in item.fixturenames or item.path.name in SPARK_FILES:
            item.add_marker(pytest.mark.spark)
        limit = LONG_TIMEOUTS.get(item.path.name)
        if limit is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit))


def pytest_configure(config):
    if os.environ.get("CUTLINE_TEST_NO_SPARK"):  # the fast lane: no Spark in this process
        from pyspark.sql.session import SparkSession

        def no_spark(builder):
            test = os.environ.get("PYTEST_CURRENT_TEST", "this test").split(" ")[0]
            raise RuntimeError(f"{test} starts Spark, which the fast lane (make test-fast) "
                               "does not: take the spark fixture, or list its file in "
                               "SPARK_FILES (tests/conftest.py)")

        SparkSession.Builder.getOrCreate = no_spark



@pytest.fixture(scope="session")
def spark():
    """One embedded Spark session for the whole test run."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from cutline.spark.launcher import embedded_session

    session = embedded_session(slots=3, max_failures=8)
    yield session
    session.stop()


@pytest.fixture
def storage(tmp_path):
    """A checkpoint storage on the test's tmp_path (the state and operator tests)."""
    from cutline.storage.checkpoints import CheckpointStorage

    return CheckpointStorage(str(tmp_path / "chk"), "job")


@pytest.fixture
def local_dirs(tmp_path, monkeypatch):
    """Working directories of state backends (RocksDB's, also those built by operators) under
    the test's tmp_path; returns where they go.  A module takes it for every test with
    ``pytestmark = pytest.mark.usefixtures("local_dirs")``."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "local"))
    return tmp_path / "local" / "cutline-state"


@pytest.fixture(scope="session")
def s3():
    """A real S3-compatible server (moto) on 127.0.0.1 with fault injection; stopped at the end."""
    pytest.importorskip("moto", reason="the s3 tests need moto[server] (pip install '.[test]')")
    pytest.importorskip("s3fs", reason="the s3 tests need s3fs (pip install '.[test]')")
    from s3util import S3, start_server

    server = start_server()
    try:
        yield S3(server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka_broker():
    """A real Kafka-protocol broker (Tansu, memory storage) on a free loopback port.

    Shared by the session: give each test its own topics (``kafka_util.unique_topic``).
    """
    pytest.importorskip("confluent_kafka",
                        reason="the Kafka tests need confluent-kafka (pip install '.[test]')")
    from kafka_util import start_broker, tansu_binary

    try:
        tansu_binary()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    broker = start_broker()
    try:
        yield broker
    finally:
        broker.stop()
