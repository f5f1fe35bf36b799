# The two commands of the README: `make demo` and `make test`.
# Both run the same idempotent set-up first (venv, packages, model); a second run installs nothing.
PY      ?= python3.11
VENV    ?= .venv
export TEOLA_VENV := $(VENV)

.PHONY: demo test test-all setup bench fidelity clean-venv
setup:
	@PY=$(PY) bash scripts/setup_env.sh

demo: setup
	@. scripts/runtime_env.sh && $(VENV)/bin/teola demo

# `make test` (CI): one vLLM engine, one model server, one Ray runtime for the session; the
# slowest tests are listed at the end. `make test-all` adds the `extended` checks, which start
# their own processes (notebooks headless, examples, the demo, README scripts, a cluster), the
# benchmark end to end, engine actors killed mid-run and the short soak.
test: setup
	@. scripts/runtime_env.sh && $(VENV)/bin/python -m pytest -m "not soak and not extended" --durations=40 $(PYTEST_ARGS)

test-all: setup
	@. scripts/runtime_env.sh && $(VENV)/bin/python -m pytest -m "not soak" --durations=30 $(PYTEST_ARGS)

# `make bench` is the quick end-to-end benchmark; `make bench BENCH_ARGS=` runs the full one.
BENCH_ARGS ?= --quick
bench: setup
	@. scripts/runtime_env.sh && $(VENV)/bin/teola bench $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)

# langchain-core's own runnable tests, plain and wrapped in TeolaRunnable (docs/fidelity.md).
fidelity: setup
	@. scripts/runtime_env.sh && $(VENV)/bin/python scripts/fidelity.py
