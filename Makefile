# Two entry points for a fresh machine (each sets up .venv on first use):
#   make run    the main job: the conformance run, quick tier (writes reports/latest.{json,md})
#   make test   the package's own tests (what CI runs)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# Where torch comes from (scripts/setup-env: auto, cpu, default, or an index URL).
TORCH_INDEX ?= auto
PYTEST_ARGS ?=
RUN_ARGS ?=
# The upgrade gate's candidate torch (default: requirements/gate-candidate.txt) and options.
CANDIDATE ?= $(shell grep -v '^\#' requirements/gate-candidate.txt | head -1)
GATE_ARGS ?=
export TORCH_SPEC TORCH_INDEX

.PHONY: setup run test gate bench bench-harness bench-reference clean

setup:
	@scripts/setup-env $(VENV)

run: setup
	$(VENV)/bin/fsdp-conformance run $(RUN_ARGS)

test: setup
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

gate: setup
	$(VENV)/bin/fsdp-conformance gate --candidate "$(CANDIDATE)" $(GATE_ARGS)

bench: setup
	$(VENV)/bin/fsdp-conformance bench scaling

bench-harness: setup
	$(VENV)/bin/fsdp-conformance bench harness

bench-reference: setup
	$(VENV)/bin/fsdp-conformance bench reference

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
