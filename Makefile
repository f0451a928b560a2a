# Two entry points for a fresh machine (each sets up .venv on first use):
#   make run    the main job (for now: the harness benchmark, writes reports/bench-harness.json)
#   make test   the package's own tests (what CI runs)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
export TORCH_SPEC

.PHONY: setup run test bench-harness clean

setup:
	@scripts/setup-env $(VENV)

run: setup
	$(VENV)/bin/fsdp-conformance bench harness

test: setup
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

bench-harness: setup
	$(VENV)/bin/fsdp-conformance bench harness

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
