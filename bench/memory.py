"""What holds each service's memory: in a fresh interpreter per service, RSS and tracemalloc's
count of Python-allocated bytes (grouped by the package that allocated them) after importing the
service, and for the registry after loading its search model and embedding a toolset's tools;
RSS the allocator cannot see (C and Rust heaps, mapped shared libraries) is the rest.

    uv run python bench/memory.py [--top 12]

The RSS of the running services, idle and after 10,000 calls, is in `make bench` (memory rows).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, sys, tracemalloc, gc
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
def by_package(snapshot):
    sizes = {}
    for stat in snapshot.statistics('filename'):
        name = stat.traceback[0].filename
        for marker in ('site-packages/', '/src/', 'python3.11/'):
            if marker in name:
                name = name.split(marker, 1)[1]
                break
        top = name.split('/', 1)[0].removesuffix('.py')
        if top.startswith('<'):
            top = '<frozen/builtins>'
        sizes[top] = sizes.get(top, 0) + stat.size
    return sorted(sizes.items(), key=lambda kv: -kv[1])
steps = []
tracemalloc.start()
def step(what):
    gc.collect()
    snap = tracemalloc.take_snapshot()
    traced = sum(s.size for s in snap.statistics('filename'))
    steps.append({'what': what, 'rss_mib': rss(), 'traced_mib': traced / 2**20,
                  'packages': [(p, s / 2**20) for p, s in by_package(snap)[:TOP]]})
step('interpreter')
import importlib
importlib.import_module('toolbus_SERVICE.app')
import toolbus_SERVICE.__main__ as _m  # noqa
step('service imported (what `python -m toolbus_SERVICE` has before serving)')
if 'SERVICE' == 'registry':
    from toolbus_registry.search import default_encoder
    default_encoder().encode(['warm the model'])
    step('search model loaded (first search or registration)')
    sys.path.insert(0, 'ROOT')
    import asyncio
    from tests.registry.search.labelled import load_tools
    from tests.registry.search.openapi_corpus import load_large_corpus
    from tests.registry.search.support import cached_embedder
    from toolbus_registry.search import SearchIndex
    embedder = cached_embedder()  # vectors from .cache/search-vectors (the file's are held too)
    index = SearchIndex.build(load_tools())
    index.attach(asyncio.run(embedder.embed(index.embedding_texts)))
    step('a 111-tool toolset indexed and embedded')
    large = SearchIndex.build(load_large_corpus())
    large.attach(asyncio.run(embedder.embed(large.embedding_texts)))
    step('the 1,350-tool toolset (Twilio) indexed and embedded')
print(json.dumps(steps))
"""


IMPORT_ORDER = (
    "numpy", "pydantic", "cryptography.fernet", "orjson", "httpx2", "httpx", "mcp", "uvicorn", "starlette",
    "nats", "redis.asyncio", "faststream", "opentelemetry.trace", "jsonschema",
    "toolbus_contracts", "toolbus_common", "toolbus_mcp_client",
)  # fmt: skip

RSS_PROBE = r"""
import importlib, json, sys, gc
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
rows = [('interpreter', rss())]
for name in NAMES:
    if name.split('.')[0] in sys.modules and name in sys.modules:
        continue
    try:
        importlib.import_module(name)
    except ImportError:
        continue
    gc.collect()
    rows.append((name, rss()))
if 'SERVICE' == 'registry':
    from toolbus_registry.search import default_encoder
    default_encoder().encode(['warm the model'])
    gc.collect()
    rows.append(('search model loaded (default_encoder)', rss()))
print(json.dumps(rows))
"""


def rss_by_import(service: str) -> list[tuple[str, float]]:
    """RSS after importing, in turn, each heavy package the service imports (its share is what it
    added first), then the service's app, then (registry) its search model: no tracemalloc, so no
    tracing overhead."""
    app = f"toolbus_{service}.__main__"
    which = subprocess.run(
        [sys.executable, "-c", f"import sys, {app}; print(' '.join(sorted(sys.modules)))"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    names = [n for n in IMPORT_ORDER if n in which] + [f"toolbus_{service}.app", app]
    code = RSS_PROBE.replace("NAMES", repr(names)).replace("SERVICE", service)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    rows: list[tuple[str, float]] = [tuple(r) for r in json.loads(out.stdout.strip().splitlines()[-1])]  # type: ignore[misc]
    return rows


def probe(service: str, top: int) -> list[dict[str, object]]:
    code = PROBE.replace("SERVICE", service).replace("TOP", str(top)).replace("ROOT", str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    steps: list[dict[str, object]] = json.loads(out.stdout.strip().splitlines()[-1])
    return steps


def main(top: int) -> None:
    for service in ("registry", "dispatcher", "approval", "credentials"):
        print(f"\n== {service}")
        rows = rss_by_import(service)
        steps = [f"{name} +{rss - prev:.1f}" for (name, rss), (_, prev) in zip(rows[1:], rows, strict=False)]
        print(f"  RSS by import (MiB, no tracing): interpreter {rows[0][1]:.1f}, " + ", ".join(steps))
        print(f"  = {rows[-1][1]:.1f} MiB")
        print("  with tracemalloc (RSS inflated by tracing; Python-allocated bytes by package, MiB):")
        previous = None
        for step in probe(service, top):
            rss, traced = float(step["rss_mib"]), float(step["traced_mib"])  # type: ignore[arg-type]
            grew = f" (+{rss - previous:.1f})" if previous is not None else ""
            print(
                f"  {step['what']}: RSS {rss:.1f} MiB{grew}, Python-allocated (tracemalloc) {traced:.1f} MiB"
            )
            packages = step["packages"]
            assert isinstance(packages, list)
            print("     " + ", ".join(f"{p} {mib:.1f}" for p, mib in packages))
            previous = rss


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=12)
    main(parser.parse_args().top)
