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
