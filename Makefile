# Two commands do all set-up on a fresh machine (Python 3.11 + Java 17):
#   make demo   - create .venv, install cutline, run the main demo
#   make test   - create .venv if needed, run the test suite
#   make lint   - ruff, mypy and the import-layering contracts (lint-imports)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python examples/wordcount.py --kill
	$(VENV)/bin/cutline simulate lecture --diagram out/lecture.png

test: lint
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy src
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) bench/protocol.py
	$(PY) bench/runtime.py
	$(PY) bench/state.py
	$(PY) bench/vs_spark.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache \
		.import_linter_cache
