# rollstream: the two commands a newcomer runs are `make demo` and `make test`.
# Both do all set-up themselves: virtualenv, Python deps, and the local stack
# (Kafka from Maven Central, Redis, a Docker engine, the sandbox image).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.deps-stamp
RS     := $(BIN)/rollstream
PYTEST_ARGS ?=

.PHONY: demo test up model down lint fmt soak venv clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

## The main job: SmolLM2 learns the `code` suite on the local stack (`--policy tiny`:
## the byte-level policy; DEMO_ARGS="--two-turn" for two-turn self-correction).
DEMO_ARGS ?=
demo: venv
	$(RS) demo $(DEMO_ARGS)

## Lint, type-check, bring the stack up (and SmolLM2 fetched and converted for the model
## tests), run every test but the soaks.
test: venv lint up model
	$(BIN)/python -m pytest -m "not soak" $(PYTEST_ARGS)

up: venv
	$(RS) up

model: venv
	$(RS) --set learner.model=smollm2 up --only model

down: venv
	$(RS) down

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m tests.architecture

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

## Long soaks, excluded from `make test`.
soak: venv up
	$(BIN)/python -m pytest -m soak $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
