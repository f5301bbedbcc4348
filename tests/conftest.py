import os
import sys

import pytest


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
