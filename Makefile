# toolbus developer commands. `make` (or `make help`) lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

UV ?= uv
PYTHON ?= .venv/bin/python
N ?= 50

.PHONY: help install up down logs status test lint docs bench helm-lint

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: ## install the workspace and dev tools from uv.lock (uv sync --frozen, dev group)
	$(UV) sync --frozen --group dev
	@touch .venv/.synced

# The stack targets install the locked environment first when it is missing or older than uv.lock,
# so `make up` works on a fresh clone.
.venv/.synced: uv.lock
	$(UV) sync --frozen --group dev
	@touch $@

up: .venv/.synced ## start NATS/Redis (if none answer) and every service that exists; wait until ready
	$(PYTHON) scripts/stack.py up

down: .venv/.synced ## stop exactly what `make up` started
	$(PYTHON) scripts/stack.py down

logs: .venv/.synced ## follow the stack's logs (make logs N=100 for more history)
	$(PYTHON) scripts/stack.py logs -f -n $(N)

status: .venv/.synced ## show what `make up` runs and whether each service is ready
	$(PYTHON) scripts/stack.py status

test: ## run the whole pytest suite (ARGS="-k name" to narrow it)
	$(UV) run --frozen pytest $(ARGS)

lint: ## ruff check, ruff format --check, and mypy --strict on libs/ and services/
	@status=0; \
	echo "ruff check libs services"; $(UV) run --frozen ruff check libs services || status=1; \
	echo "ruff format --check libs services"; $(UV) run --frozen ruff format --check libs services || status=1; \
	echo "mypy libs services"; $(UV) run --frozen mypy libs services || status=1; \
	exit $$status

docs: ## regenerate docs/asyncapi.yaml (AsyncAPI 3, every subject) from the code
	$(UV) run --frozen python scripts/asyncapi.py

bench: ## run every bench/*.py, each printing its figures
	@shopt -s nullglob; files=(bench/*.py); \
	if [ $${#files[@]} -eq 0 ]; then echo "no benchmarks in bench/ yet"; exit 0; fi; \
	for f in "$${files[@]}"; do echo "== $$f"; $(UV) run --frozen python "$$f" || exit $$?; done

helm-lint: ## helm lint each chart under deploy/helm/ (skipped when helm is not installed)
	@if ! command -v helm >/dev/null 2>&1; then echo "helm-lint skipped: helm is not installed"; exit 0; fi; \
	shopt -s nullglob; charts=(deploy/helm/*/Chart.yaml); \
	if [ $${#charts[@]} -eq 0 ]; then echo "no charts under deploy/helm/ yet"; exit 0; fi; \
	for c in "$${charts[@]}"; do helm lint "$$(dirname "$$c")" || exit $$?; done
