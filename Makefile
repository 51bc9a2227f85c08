# toolbus developer commands. `make` (or `make help`) lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

UV ?= uv
PYTHON ?= .venv/bin/python
N ?= 50

.PHONY: help install up down logs status test lint docs bench bench-peers bench-alternatives bench-profile bench-memory images compose-env charts helm-lint

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

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

bench: ## one table of every figure beside its baseline (ARGS="--json out.json", "--calls 10" for a short run)
	$(UV) run --frozen python bench/table.py $(ARGS)

bench-peers: ## the same call through IBM ContextForge (own venv under .cache/), direct and toolbus; optional
	$(UV) run --frozen python bench/peers.py $(ARGS)

bench-alternatives: ## own HTTP/1.1 and Redis clients vs aiohttp, httpx2, redis-py, coredis, valkey-glide (own venv)
	UV_PROJECT_ENVIRONMENT=.cache/bench-venv $(UV) run --frozen --group bench-alternatives python bench/alternatives.py $(ARGS)

bench-profile: ## where the dispatcher's time goes per call (py-spy on a live dispatcher)
	$(UV) run --frozen python bench/profile.py $(ARGS)

bench-memory: ## what holds each service's memory (RSS by import, tracemalloc by package)
	$(UV) run --frozen python bench/memory.py $(ARGS)

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
