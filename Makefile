# The two commands a newcomer runs: `make demo` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU build by default (it lies on these machines' disk). GPU users, for example:
#   make setup TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH ?= torch==2.13.0
JOBS ?= 2

.PHONY: setup test demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) -q

demo: $(STAMP)
	$(VENV)/bin/transduce info small --set vocab_size=8000

clean:
	rm -rf $(VENV) .pytest_cache
