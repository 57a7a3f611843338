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

.PHONY: setup jemalloc test demo multi30k bench clean
# demo training budget in minutes (the issue: at most 15); e.g. `make demo DEMO_MINUTES=3`
DEMO_MINUTES ?= 15
# Multi30k target language (de or fr), seed, and LOWERCASE=true for the papers' lowercased text
LANG_TGT ?= de
SEED ?= 1
LOWERCASE ?= false
# On a CPU without native bf16 (AVX-512-BF16 or AMX) training runs in fp32, about 5k updates in the hour
# instead of 10k, and the config's BiT costs more than it gives: there `make multi30k` drops BiT, uses a
# GELU feed-forward (attempts 50-55 in the README) and peak learning rate 0.004 (session 34's GPU sweep at
# 5,000 updates, attempts 56-57). FP32_RECIPE=auto decides from /proc/cpuinfo; true or
# false forces it.
FP32_RECIPE ?= auto
NATIVE_BF16 := $(shell grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo 2>/dev/null && echo true)
USE_FP32_RECIPE := $(if $(filter auto,$(FP32_RECIPE)),$(if $(NATIVE_BF16),,true),$(filter true,$(FP32_RECIPE)))

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
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

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) -q

demo: $(STAMP)
	$(VENV)/bin/transduce demo --minutes $(DEMO_MINUTES)

# Multi30k en->$(LANG_TGT): prepare, train (<= 60 min), average, decode test_2016_flickr and val, score
multi30k: $(STAMP)
	$(VENV)/bin/transduce recipe configs/multi30k-en-de.toml --set prepare.tgt='"$(LANG_TGT)"' \
		--set prepare.lowercase=$(LOWERCASE) --set recipe.seed=$(SEED) \
		--set recipe.out='"runs/multi30k-en-$(LANG_TGT)$(if $(filter true,$(LOWERCASE)),-lc)$(if $(USE_FP32_RECIPE),-fp32)-seed$(SEED)"' \
		$(if $(USE_FP32_RECIPE),--set train.bidirectional=0 --set train.diversify='"off"' --set model.activation='"gelu"' --set train.peak_lr=0.004)

# Side-by-side benchmarks (issue 8): about an hour on an idle machine; not part of `make test`
bench: $(STAMP)
	$(PY) bench/run.py --out BENCHMARKS.md

clean:
	rm -rf $(VENV) .pytest_cache
