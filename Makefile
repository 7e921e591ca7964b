# Everything a newcomer needs runs from here; the venv and every dependency
# (the Temporal server binary included) are bootstrapped on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
PYTEST_ARGS ?=
# Two pytest processes, each with its own Temporal dev server and localplane: the suite waits
# on timers and trainers more than it computes (serially it kept 0.76 of the 2 cores busy and
# took 19 min when two took 11). On 2026-11-28 two took 21:50 (1.6 cores busy) and three
# 17:18; three loaded the machine enough to show a race in the cookbook tests' own checks (a
# preemption striking while the last one's restore ran: fixed in the checks, the weights were
# right), so three it is.
# A module's tests stay on one process (its fixtures are shared); the longest modules are
# handed out first (tests/conftest.py).
TEST_WORKERS ?= 3

.PHONY: help bootstrap browser test lint demo dev bench bench-scale clean

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
	# torch before anything that needs it: this pin takes the CPU wheel (the cookbook's
	# torch>=2.10 would otherwise pull a CUDA build, several GB).
	$(BIN)/python -m pip install --quiet 'torch==2.13.0'
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

bootstrap: $(STAMP)

# The Web UI test drives Debian's Chromium: install it where the machine allows (root and
# apt-get), otherwise that one test is skipped with a message saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Chromium for the Web UI test ..."; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "note: could not install Chromium; the Web UI test will be skipped"; \
	  else echo "note: Chromium is not installed; the Web UI test will be skipped"; fi; }

# Every test starts Python processes (trainers, the plane, CLI calls): with bytecode caching off
# (PYTHONDONTWRITEBYTECODE, set on some machines) each one compiles the project's sources
# again, 0.5 s of CPU per start on 2 cores. The suite turns it back on for itself.
test: export PYTHONDONTWRITEBYTECODE =
test: $(STAMP) browser
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shepherd workflows activities

demo: $(STAMP)
	$(BIN)/shepherd demo

dev: $(STAMP)
	$(BIN)/shepherd dev

# Benchmarks print JSON (kept in bench/out/) and draw their plots there.
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	@mkdir -p bench/out
	$(BIN)/python bench/plane.py | tee bench/out/plane.json
	$(BIN)/python bench/overhead.py | tee bench/out/overhead.json
	$(BIN)/python bench/recovery.py | tee bench/out/recovery.json
	$(BIN)/python bench/sdk_compare.py | tee bench/out/sdk_compare.json
	$(BIN)/python bench/crash.py | tee bench/out/crash.json
	$(BIN)/python bench/determinism.py | tee bench/out/determinism.json
	$(BIN)/python bench/trainer_memory.py | tee bench/out/trainer_memory.json
	$(BIN)/python bench/proxy.py | tee bench/out/proxy.json
	$(BIN)/python bench/history.py | tee bench/out/history.json
	$(BIN)/python bench/outage.py | tee bench/out/outage.json
	$(BIN)/python bench/outage.py --fault platform --down 30,180 | tee bench/out/partition.json

# Thousands of queued jobs on 4 slots: hours for the full list (docs/scale.md).
bench-scale: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	@mkdir -p bench/out
	$(BIN)/python bench/scale.py | tee bench/out/scale.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .shepherd
