import os
import sys

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


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept



@pytest.fixture(scope="session")
def spark():
    """One embedded Spark session for the whole test run."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from cutline.spark.launcher import embedded_session

    session = embedded_session(slots=3, max_failures=8)
    yield session
    session.stop()


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
