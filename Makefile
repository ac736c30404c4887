# Two commands set up a fresh machine: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch that lies on these machines' disk; `make install TORCH=torch==2.14.1` for another.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUDGET ?= 2m

.PHONY: install demo check test bench-smoke bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	# torch named again, so that nothing the extras pull in (lightning, torchdata) can replace it.
	$(BIN)/python -m pip install --quiet -e ".[test,report]" "$(TORCH)"
	touch $(STAMP)

install: $(STAMP)

# Tune the bundled JPEG example (writes the images once, then searches for BUDGET and prints the recipe).
demo: $(STAMP)
	$(BIN)/autotune search examples/jpeg_folder.py --budget $(BUDGET) --recipe autotune.json
	$(BIN)/autotune show autotune.json

# The linters the project keeps clean (configured in pyproject.toml; lint-imports keeps the layers); `make test` runs them first.
check: $(STAMP)
	$(BIN)/ruff check autotune tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports

# Four workers, one test file each at a time: much of the suite waits on real processes, budgets, timeouts
# and servers rather than computing, so two workers leave the CPUs partly idle. Quiet, on the Intel Xeon
# 2-vCPU VM (2026-12-02): two workers 401 s (598 CPU-seconds, 1.49 CPUs busy), four 342 s (640, 1.87).
# `make test WORKERS=0` runs it in one process.
# The benchmarks' smoke test is not the product's: it runs every script of benchmarks/ in its --quick
# mode (~8 minutes of both CPUs), so it has its own target, which CI runs after this one.
WORKERS ?= 4
test: check
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder -m "not bench" $(PYTEST_ARGS)

# Every benchmark script end to end in its --quick mode: each runs, prints its table, writes its JSON.
bench-smoke: $(STAMP)
	$(BIN)/python -m pytest -q -m bench tests/test_benchmarks_smoke.py $(PYTEST_ARGS)

# Every script in benchmarks/ (~57 minutes on 2 quiet CPUs, 2026-12-01); `make bench-smoke` checks them in their --quick modes.
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .autotune autotune.json examples/data
