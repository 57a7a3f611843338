# The two commands a newcomer runs: `make demo` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# PyTorch's CPU build by default. GPU users, for example:
#   make setup TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH ?= torch==2.13.0
JOBS ?= 2
# where `make test` and `make test-fast` keep the tests' trained model between runs (tests/conftest.py)
TEST_CACHE ?= .cache/tests

.PHONY: setup jemalloc lint test test-fast demo multi30k bench bench-simd bench-libretranslate clean
# demo training budget in minutes; e.g. `make demo DEMO_MINUTES=3` for a quick look
DEMO_MINUTES ?= 15
# Multi30k target language (de or fr), seed, and LOWERCASE=true for the papers' lowercased text
LANG_TGT ?= de
SEED ?= 1
LOWERCASE ?= false
# more `--set SECTION.KEY=VALUE` for `make multi30k`, e.g. ARGS="--set train.max_minutes=30". The recipe is the
# same in bf16 and fp32 (a 2-core CPU without native bf16 made 3,810 updates in the hour, against 9,000-10,000 in bf16).
ARGS ?=

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	# argostranslate (MIT; tests/test_interop_argos.py installs exported packages with it) without its declared
	# dependencies: it asks for sacremoses<0.2 where transduce pins 0.2.0 (argostranslate uses sacremoses only for
	# bpe.model packages) and for minisbd, which is AGPL; stanza, the rest it imports, is in the dev extra.
	$(PY) -m pip install -q --no-deps argostranslate==1.11.0
	$(MAKE) --no-print-directory jemalloc
	touch $@

# jemalloc in the venv's lib/, where training finds it (src/transduce/allocator.py: on CPUs with native bf16,
# training is faster with it than with glibc's malloc). Best effort, no root: the Debian package's file;
# elsewhere a message.
jemalloc:
	@if [ -f $(VENV)/lib/libjemalloc.so.2 ]; then exit 0; fi; \
	tmp=$$(mktemp -d); \
	if command -v apt-get >/dev/null && command -v dpkg >/dev/null \
	   && (cd $$tmp && apt-get download -q libjemalloc2 >/dev/null 2>&1 && dpkg -x libjemalloc2_*.deb x) \
	   && lib=$$(find $$tmp/x -name libjemalloc.so.2 | head -n 1) && [ -n "$$lib" ]; then \
	  cp -L "$$lib" $(VENV)/lib/ && echo "jemalloc: $(VENV)/lib/libjemalloc.so.2 (from Debian's libjemalloc2)"; \
	else \
	  echo "jemalloc: not fetched (needs apt-get and dpkg); training uses glibc's malloc, slower on CPUs with native bf16:" \
	       "install libjemalloc2 or set TRANSDUCE_JEMALLOC=/path/to/libjemalloc.so.2"; \
	fi; \
	rm -rf $$tmp

# style: ruff (pinned in pyproject.toml's dev extra), lint rules and formatting
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

test: $(STAMP)
	TRANSDUCE_TEST_CACHE=$(CURDIR)/$(TEST_CACHE) $(PY) -m pytest -n $(JOBS) -q --durations=25

# for development: the suite without the tests marked slow (pyproject.toml), about a minute on 2 cores once
# `make test` has built the C++ kernels and trained the tests' model
test-fast: $(STAMP)
	TRANSDUCE_TEST_CACHE=$(CURDIR)/$(TEST_CACHE) $(PY) -m pytest -n $(JOBS) -q -m "not slow" --durations=10

demo: $(STAMP)
	$(VENV)/bin/transduce demo --minutes $(DEMO_MINUTES)

# Multi30k en->$(LANG_TGT): prepare, train (<= 60 min), average, decode test_2016_flickr and val, score
multi30k: $(STAMP)
	$(VENV)/bin/transduce recipe configs/multi30k-en-de.toml --set prepare.tgt='"$(LANG_TGT)"' \
		--set prepare.lowercase=$(LOWERCASE) --set recipe.seed=$(SEED) \
		--set recipe.out='"runs/multi30k-en-$(LANG_TGT)$(if $(filter true,$(LOWERCASE)),-lc)-seed$(SEED)"' $(ARGS)

# Side-by-side benchmarks (docs/performance.md): about an hour on an idle machine; not part of `make test`
bench: $(STAMP)
	$(PY) bench/run.py --out BENCHMARKS.md

# transduce serve against the real LibreTranslate (pinned, in its own venv, offline) on the same two models: the
# demo's, on the demo's Bible sentences, and a base-size one trained for 55 minutes on Multi30k
# (configs/bench-base-multi30k.toml, one process on all cores), on Multi30k's test sentences (../shared's copy
# where there is one, else downloaded); not part of `make test`
LT_VENV := runs/bench/lt/venv
M30K_RAW := $(if $(wildcard ../shared/data/multi30k/train.en.gz),--raw ../shared/data/multi30k,--download)
bench-libretranslate: $(STAMP)
	test -x $(LT_VENV)/bin/libretranslate || { $(PYTHON) -m venv $(LT_VENV) && $(LT_VENV)/bin/pip install -q $(TORCH) \
	  && $(LT_VENV)/bin/pip install -q libretranslate==1.9.6 && $(LT_VENV)/bin/pip install -q spacy==3.8.18 'rich<13'; }
	test -f runs/demo/model/config.toml || $(VENV)/bin/transduce demo --minutes $(DEMO_MINUTES)
	test -f runs/m30k/manifest.json || $(VENV)/bin/transduce prepare multi30k --src en --tgt de $(M30K_RAW) \
	  --out runs/m30k --vocab-size 8000
	test -f runs/bench/base-m30k/model/config.toml || $(VENV)/bin/transduce train configs/bench-base-multi30k.toml
	$(PY) bench/libretranslate.py --model small=runs/demo/model --sentences runs/demo/data/test.en \
	  --model base=runs/bench/base-m30k/model --sentences runs/m30k/test.en --lt-venv $(LT_VENV) \
	  | tee runs/bench/libretranslate.md

# vecmath.h's exp and GELU against Google Highway and SLEEF (apt-get install libhwy-dev libsleef-dev)
bench-simd: $(STAMP)
	$(PY) bench/simd_libraries.py --repeats 3

clean:
	rm -rf $(VENV) .pytest_cache $(TEST_CACHE)
