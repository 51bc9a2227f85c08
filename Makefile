# toolbus developer commands. `make` (or `make help`) lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

UV ?= uv
PYTHON ?= .venv/bin/python
N ?= 50

.PHONY: help install up down logs status test lint docs bench images compose-env charts helm-lint

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

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

SERVICES := registry dispatcher approval credentials
IMAGE_PREFIX ?= toolbus-
IMAGE_TAG ?= dev

images: ## build the four service images (toolbus-<service>:$(IMAGE_TAG)) from deploy/image/Dockerfile; needs a Docker engine
	@for s in $(SERVICES); do \
		echo "== $(IMAGE_PREFIX)$$s:$(IMAGE_TAG)"; \
		DOCKER_BUILDKIT=1 docker build -f deploy/image/Dockerfile --build-arg SERVICE=$$s \
			-t $(IMAGE_PREFIX)$$s:$(IMAGE_TAG) . || exit $$?; \
	done

compose-env: .venv/.synced ## write deploy/compose/.env from .env.example with fresh secrets (keeps an existing one)
	$(PYTHON) scripts/compose_env.py

charts: .venv/.synced ## rewrite the generated files of the Helm charts (scripts/charts.py)
	$(PYTHON) scripts/charts.py generate

helm-lint: .venv/.synced ## helm lint --strict, render and validate every chart (Helm's Go library via helm-python-sdk; no binary)
	$(PYTHON) scripts/charts.py lint
