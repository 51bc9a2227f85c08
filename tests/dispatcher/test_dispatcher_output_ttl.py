"""The outputs bucket's TTL follows the call records' retention, against real NATS JetStream and
Redis: by default the run retention + 23 days, an explicit TTL below the retention refused at
start, and an existing bucket updated to the TTL the dispatcher starts with."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from toolbus_dispatcher.settings import OPEN_RUN_ALLOWANCE, DispatcherSettings

from tests.dispatcher.test_dispatcher_helpers import Harness
from tests.support.infra import js_name

pytestmark = pytest.mark.integration

DAY = 86400.0


def test_the_default_ttl_is_the_run_retention_plus_the_open_run_allowance() -> None:
    assert DispatcherSettings().output_ttl == 30 * DAY  # the 7-day default + 23 days
    assert DispatcherSettings(dispatcher_run_retention=60 * DAY).output_ttl == 60 * DAY + OPEN_RUN_ALLOWANCE
    assert DispatcherSettings(dispatcher_output_ttl=9 * DAY).output_ttl == 9 * DAY
    with pytest.raises(ValidationError, match="at least TOOLBUS_DISPATCHER_RUN_RETENTION"):
        DispatcherSettings(dispatcher_run_retention=10 * DAY, dispatcher_output_ttl=9 * DAY)


async def test_the_bucket_takes_the_ttl_of_the_retention_it_starts_with(
    nats_url: str, redis_url: str
) -> None:
    h = Harness(nats_url, redis_url)
    await h.connect()
    assert h.nc is not None
    js = h.nc.jetstream()
    stream = "OBJ_" + js_name(h.prefix, "outputs")
    try:
        first = await h.dispatcher(dispatcher_run_retention=2 * DAY)
        info = await js.stream_info(stream)
        assert info.config.max_age == pytest.approx(2 * DAY + OPEN_RUN_ALLOWANCE)
        await first.stop(grace=1.0)
        h.apps.remove(first)
        await h.dispatcher(dispatcher_run_retention=40 * DAY)
        info = await js.stream_info(stream)
        assert info.config.max_age == pytest.approx(40 * DAY + OPEN_RUN_ALLOWANCE)
    finally:
        await h.close()
