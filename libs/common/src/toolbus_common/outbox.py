"""The outbox: how every service publishes what follows a state change.

Failure model (the one every publisher of toolbus has):
- Written with the change. The Lua script that changes the state also appends the message to the
  service's outbox, a Redis stream (`LUA`: `outbox_add(key, subject, msg_id, body)`; fields `s`
  subject, `i` message id, `b` body). A script runs as one step, so no crash falls between the
  change and the message it owes.
- Relayed at least once. `OutboxRelay` publishes each entry to JetStream with its message id as
  `Nats-Msg-Id` and deletes the entry only once the stream acked it (a PubAck, `duplicate` or not).
  A crash, a NATS or Redis outage between the publish and the delete only means the entry is
  published again by the next relay (another replica, or this one restarted).
- Duplicates are harmless. A message id names the change, not the attempt (`<callId>:<n>`,
  `approval-decided-<id>`), so JetStream's duplicate window (2 minutes by default) drops a second
  copy; a command's consumer applies it once whatever copy comes later (a decision for a call no
  longer waiting, a resume of a call no longer parked are ignored).
- Ordered where it matters. Entries with the same order key (`order`, default: each its own) are
  published one after the other, each only once the one before was acked; when one fails, the later
  entries of its key stay in the outbox, untouched, until it went through (retried with a backoff of
  its own), while other keys' entries go on. A batch is published in rounds: the first pending entry
  of every key, pipelined, then the acks awaited, then the next of each. Every pass over the outbox
  starts from its oldest entry, so an entry held back is always met before the later ones of its key.
- One relay at a time: the replicas share a lock (`SET NX PX`, token per relay, renewed every third
  of its TTL, released on stop); the others try to take it every third of the TTL, so a dead holder
  is replaced within about the TTL plus a third. Before each batch and each round the holder checks
  that its lock is still valid by its own clock (fencing). Order does not rest on the lock: an entry
  is published only after the one before it of its key was acked, so two relays briefly overlapping
  only publish duplicates, which JetStream drops.
- Commands are signed: entries on the `commands` subject prefix (`<prefix>.internal.`) carry the
  signature their consumers check (`CommandSigner`).

Cost: acks come to one inbox subscription of the relay's, each round waiting on one future its acks
count down (`_Round`), not a request and a task per message. Under load the relay lingers (`LINGER`)
so each read, delete and round carries more entries; a small batch waits for this process's
`calls.invoke` requests (`DEFER`). The outbox is read (`XREAD BLOCK`) and trimmed (`XDEL`) over a
`ScriptPipe` of the relay's own (a blocking read holds its connection); the lock stays on redis-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections import deque
from collections.abc import Callable

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import MaxPayloadError
from redis.asyncio import Redis
from redis.exceptions import LockError, ResponseError

from toolbus_common.in_flight import InFlight
from toolbus_common.outages import expected_fault
from toolbus_common.private.raw_pub import Batch, fits
from toolbus_common.private.redis_lock import forget_token, has_token
from toolbus_common.redis_values import text as _s
from toolbus_common.script_pipe import ScriptPipe, ScriptReplyError
from toolbus_common.settings import REDIS_LONGEST_BLOCK
from toolbus_common.signing import SIGNATURE_HEADER, CommandSigner
from toolbus_common.tasks import cancel_and_wait

log = logging.getLogger(__name__)

BATCH = 512
LINGER = 0.005
LINGER_FROM = 4
"""After a batch of at least `LINGER_FROM` entries (more than one call's worth: calls are coming
in) and fewer than `BATCH`, the relay waits `LINGER` seconds before reading the next, so that
entries gather meanwhile and each read, delete and publishing round carries more of them (on two
cores, fewer and larger batches is CPU for the calls themselves). A quiet outbox is read at once:
the blocking read returns with the first entry, and a call's own few entries never linger."""
DEFER = 0.002
"""On a quiet dispatcher a call's own `create_call` script wakes the relay (its `XADD`s end the
relay's blocking read), and publishing then shares the event loop with the call's MCP request,
its `finish_call` script and its reply. So a batch of fewer than `LINGER_FROM` entries waits
until this process serves no `calls.invoke`, at most until `DEFER` seconds after the newest came
in: a quiet call's MCP request, second script and reply take ~1-1.5 ms here, and a call running
longer (a slow tool) is not waited for. Under load batches are larger and linger instead."""
ACK_WAIT = 5.0
"""Seconds a round waits for JetStream's acks; an entry without one counts as failed (sent again)."""
RETRY_MAX = 5.0
"""Longest pause before a failed entry (or, after a batch where nothing went through, the
next batch) is tried again; pauses start at `retry_pause` and double."""

Entry = tuple[bytes, dict[bytes, bytes]]

LUA = """
-- Owe a message with the state change this script makes (toolbus_common.outbox): the relay
-- publishes it to `subject` with `msg_id` as Nats-Msg-Id.
local function outbox_add(outbox, subject, msg_id, body)
  return redis.call('XADD', outbox, '*', 's', subject, 'i', msg_id, 'b', body)
end
"""
"""The Lua function every script that owes a message prepends and calls (the entry's layout)."""


def own_key(msg_id: str) -> str:
    """The default order key: every entry its own (no order among entries)."""
    return msg_id


class _Round:
    """The acks of one publishing round: `results[i]` for its i-th entry (False until a PubAck
    came), `done` once every entry sent has its answer (`complete`), or when the waiter's time
    slice ends (`wake`: the waiter then sees it not complete and waits on a new `done`)."""

    __slots__ = ("done", "pending", "results", "sending")

    def __init__(self, n: int, done: asyncio.Future[None]) -> None:
        self.results = [False] * n
        self.done = done
        self.pending = 0
        self.sending = True

    def answer(self, i: int, ok: bool) -> None:
        self.results[i] = ok
        self.pending -= 1
        if not self.pending and not self.sending and not self.done.done():
            self.done.set_result(None)

    def sent(self) -> None:
        """Publishing is over (acks may all have come during it)."""
        self.sending = False
        if not self.pending and not self.done.done():
            self.done.set_result(None)

    @property
    def complete(self) -> bool:
        return not self.pending and not self.sending

    def wake(self) -> None:
        """The waiter's time slice is over (a timer's callback)."""
        if not self.done.done():
            self.done.set_result(None)


class OutboxRelay:
    """Publishes outbox entries to JetStream, once each (per message id), in order per order key;
    one relay among the replicas at a time (see the module)."""

    def __init__(
        self,
        redis: Redis[bytes],
        nc: NatsClient,
        outbox: str,
        consumer: str,
        *,
        pipe: ScriptPipe,
        lock: str | None = None,
        lock_ttl: float = 3.0,
        block_ms: int = int(REDIS_LONGEST_BLOCK * 1000),  # within the pipe's reply timeout
        retry_pause: float = 0.2,
        linger: float = LINGER,
        invokes: InFlight | None = None,
        signer: CommandSigner | None = None,
        commands: str = "",
        order: Callable[[str], str] = own_key,
    ) -> None:
        self._r = redis
        self._order = order
        # Entries on `commands` (the INTERNAL stream's subjects, `<prefix>.internal.`) are
        # service-to-service commands: signed, so that their consumers apply them.
        self._signer = signer
        self._commands = commands.encode()
        self._pipe = pipe  # the relay's own connection: XREAD BLOCK holds it (see the module)
        self._nc = nc
        self._outbox = outbox
        self._inbox = nc.new_inbox()  # under TOOLBUS_NATS_INBOX_PREFIX, which its user may subscribe to
        self._acks: dict[str, tuple[_Round, int]] = {}  # reply subject -> its round and place
        self._seq = itertools.count()
        self._sub: Subscription | None = None
        self._running_loop: asyncio.AbstractEventLoop | None = None  # see `_loop`
        # redis-py's lock: SET NX PX to take it, a compare-and-PEXPIRE script to renew, a
        # compare-and-DEL one to release; the token is this relay's, not the thread's.
        self._lock = redis.lock(
            lock or f"{outbox}:relay",
            timeout=lock_ttl,
            blocking=False,
            thread_local=False,
        )
        self._token = f"{consumer}:{uuid.uuid4().hex[:8]}"
        self._ttl = lock_ttl
        self._valid_until = 0.0  # loop time until which the lock is ours for sure (fencing)
        self._renew_at = 0.0
        self._block = max(1, min(block_ms, int(REDIS_LONGEST_BLOCK * 1000), int(lock_ttl * 1000 / 3)))
        self._pause = retry_pause
        self._linger = linger
        self._invokes = invokes
        """This process's `calls.invoke` requests: a small batch waits for them (`DEFER`)."""
        self._held: dict[str, float] = {}  # order key -> loop time its entry may be tried again
        self._backoff: dict[str, float] = {}  # order key -> its last pause
        self._acked: list[bytes] = []  # entries JetStream acked, deleted with the next read
        self._task: asyncio.Task[None] | None = None  # `start`'s
        self.relayed = 0
        self.acquired = 0
        """How many times this relay took the lock (for tests and logs)."""

    # ---- the lock -------------------------------------------------------------------------------

    @property
    def holding(self) -> bool:
        """Whether this relay holds the lock by its own clock (and so may publish)."""
        return asyncio.get_running_loop().time() < self._valid_until

    async def _take(self) -> bool:
        """Take the lock if free, or renew it if ours; True when ours. Redis errors propagate."""
        sent = self._loop.time()
        was = sent < self._valid_until
        ours = False
        if has_token(self._lock):
            try:
                ours = bool(await self._lock.reacquire())
            except LockError:  # LockNotOwnedError: it lapsed and was taken, or Redis lost it
                forget_token(self._lock)
        if not ours:
            ours = bool(await self._lock.acquire(blocking=False, token=self._token))
            if ours:
                self.acquired += 1
                log.info("outbox relay: this replica relays the outbox now")
        if ours:
            self._valid_until = sent + self._ttl * 2 / 3
            self._renew_at = sent + self._ttl / 3
        else:
            self._valid_until = 0.0
            if was:
                log.warning("outbox relay: lock lost to another replica; this one stops publishing")
        return ours

    async def _fence(self) -> bool:
        """Renew the lock when due; True while it is ours (checked before each batch and round)."""
        loop = self._loop
        if loop.time() >= self._renew_at:
            try:
                await self._take()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis unreachable: the lock holds until its validity ends
                log.warning("outbox relay: could not renew the lock", extra={"error": type(exc).__name__})
                self._renew_at = loop.time() + min(0.2, self._ttl / 10)
        return loop.time() < self._valid_until

    async def release(self) -> None:
        """Give the lock up (on stop), so that another replica takes over at once."""
        self._valid_until = self._renew_at = 0.0
        if has_token(self._lock):
            with contextlib.suppress(Exception):  # not ours any more, or Redis away: it lapses
                await self._lock.release()

    # ---- relaying -------------------------------------------------------------------------------

    def _on_ack(self, msg: Msg) -> None:
        """Count one ack towards its round (never blocks)."""
        waiting = self._acks.pop(msg.subject, None)
        if waiting is None:  # a late ack of a round given up, or not ours
            return
        data = msg.data
        # A PubAck (`{"stream":..,"seq":..}`, `"duplicate":true` for a copy already stored) is a
        # success; an error reply or a status message (503: no stream captures it) is not.
        waiting[0].answer(waiting[1], bool(data) and data.startswith(b"{") and b'"error"' not in data)

    async def _ack(self, msg: Msg) -> None:
        """The ack subscription's callback (nats-py awaits it one message at a time)."""
        self._on_ack(msg)

    async def _subscribe(self) -> None:
        if self._sub is None:
            self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._ack)

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        """The loop this relay runs on: kept by `run` and `drain` (looking it up costs a system
        call), looked up once by any other first caller."""
        if self._running_loop is None:
            self._running_loop = asyncio.get_running_loop()
        return self._running_loop

    async def run(self) -> None:
        """Relay while holding the lock, compete for it otherwise, until cancelled; outages are
        waited out (entries stay in the outbox meanwhile)."""
        self._running_loop = asyncio.get_running_loop()
        pause = self._pause
        while True:
            try:
                await self._subscribe()
                if not await self._take():
                    await asyncio.sleep(self._ttl / 3)
                    continue
                await self._relay_while_held()
                await self._delete_acked()  # the lock is lost: leave no acked entry behind
                pause = self._pause
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if expected_fault(exc, "outbox relay"):
                    pass  # an outage: logged once (`outages`), waited out
                elif isinstance(exc, ResponseError | ScriptReplyError):
                    log.warning("outbox relay: Redis refused a command", extra={"error": str(exc)[:200]})
                else:
                    log.exception("outbox relay failed; trying again")
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX)

    async def _relay_while_held(self) -> None:
        """Passes over the outbox while the lock is ours. A pass starts at the oldest entry (again
        whenever a held-back key's pause is over); between, the cursor only moves on, since every
        entry before it was published and deleted or belongs to a held-back key."""
        loop = self._loop
        cursor = b"0-0"
        pause = self._pause
        while await self._fence():
            now = loop.time()
            if self._held:
                due = min(self._held.values())
                if due <= now:
                    self._held = {k: t for k, t in self._held.items() if t > now}
                    cursor = b"0-0"
                    continue
                wait = min(self._block, int((due - now) * 1000) + 1)
            else:
                wait = self._block
            wait = max(1, min(wait, int((self._valid_until - now) * 1000)))
            entries = await self._read(cursor, wait)
            if not entries:
                continue
            cursor = entries[-1][0]
            if self._invokes is not None and self._invokes.busy and len(entries) < LINGER_FROM:
                # after the call that woke us replied (see DEFER)
                await self._invokes.idle(DEFER - self._invokes.since_entered(), loop)
            sent, failed = await self._publish(entries)
            if failed and not sent:  # nothing went through: NATS or the stream is down, likely
                await asyncio.sleep(min(pause, self._ttl / 3))  # never so long that the lock lapses
                pause = min(pause * 2, RETRY_MAX)
            else:
                pause = self._pause
                if self._linger and LINGER_FROM <= len(entries) < BATCH:
                    await asyncio.sleep(self._linger)  # busy: let the next batch fill (see LINGER)

    async def _read(self, cursor: bytes, block_ms: int | None) -> list[Entry]:
        """The next entries after `cursor`; what was acked since the last read is deleted first
        (so a pass from the oldest entry never sees it)."""
        command: tuple[bytes | str | int, ...] = ("XREAD", "COUNT", BATCH)
        if block_ms is not None:
            command += ("BLOCK", block_ms)
        command += ("STREAMS", self._outbox, cursor)
        deletes, self._acked = self._acked, []
        if deletes:
            try:
                await self._pipe.execute("XDEL", self._outbox, *deletes)
            except BaseException:  # not known to be deleted: sent again (deleting twice is harmless)
                self._acked[:0] = deletes
                raise
            self.relayed += len(deletes)
        res = await self._pipe.execute(*command)
        if not res:
            return []
        entries: list[Entry] = []
        for eid, flat in res[0][1]:
            if flat:  # [field, value, field, value, ...]
                it = iter(flat)
                entries.append((eid, dict(zip(it, it, strict=False))))
        return entries

    async def _publish(self, entries: list[Entry]) -> tuple[int, int]:
        """Publish a batch in order per key (in rounds); delete what JetStream acked. Returns
        (published, failed); entries of held-back keys count as neither and stay."""
        await self._subscribe()
        chains: dict[str, deque[Entry]] = {}
        for entry in entries:
            key = self._order(_s(entry[1][b"i"]))
            if key in self._held:
                continue
            chain = chains.get(key)
            if chain is None:
                chains[key] = deque((entry,))
            else:
                chain.append(entry)
        done: list[bytes] = []
        failed = 0
        error: BaseException | None = None
        while chains:
            if not await self._fence():
                break
            round_ = [(key, chain.popleft()) for key, chain in chains.items()]
            results, error = await self._round([fields for _, (_, fields) in round_])
            for (key, (eid, _)), ok in zip(round_, results, strict=True):
                if ok:
                    done.append(eid)
                    if self._backoff:
                        self._backoff.pop(key, None)
                    if not chains[key]:
                        del chains[key]
                else:
                    failed += 1
                    self._hold(key)
                    del chains[key]
        # Deleted with the next read (`_read`), or by `_delete_acked` when relaying stops.
        self._acked += done
        if failed:
            log.warning(
                "outbox relay: JetStream did not take some entries; they and the later ones of their keys wait and are sent again",
                extra={"failed": failed, "error": type(error).__name__ if error else "no ack"},
            )
        return len(done), failed

    async def _delete_acked(self) -> None:
        """Delete what JetStream acked and no read has carried yet (relaying stops: the lock was
        lost, or shutdown). Safe without the lock: those entries are in the stream."""
        deletes, self._acked = self._acked, []
        if deletes:
            try:
                await self._pipe.execute("XDEL", self._outbox, *deletes)
            except BaseException:
                self._acked[:0] = deletes
                raise
            self.relayed += len(deletes)

    def _signature(self, fields: dict[bytes, bytes]) -> bytes:
        """The signature of a command entry (none for an event)."""
        subject = fields[b"s"]
        if self._signer is None or not self._commands or not subject.startswith(self._commands):
            return b""
        return self._signer.sign(subject.decode(), fields[b"b"]).encode()

    def _hold(self, key: str) -> None:
        pause = min(self._backoff.get(key, self._pause / 2) * 2, RETRY_MAX)
        self._backoff[key] = pause
        self._held[key] = self._loop.time() + pause

    async def _round(self, batch: list[dict[bytes, bytes]]) -> tuple[list[bool], BaseException | None]:
        """Publish one entry each of distinct keys, pipelined; wait for their acks."""
        loop = self._loop
        round_ = _Round(len(batch), loop.create_future())
        replies: list[str] = []
        error: BaseException | None = None
        out = Batch(self._nc)  # the round in one write, one flusher wake-up (see raw_pub)
        for i, fields in enumerate(batch):
            reply = f"{self._inbox}.{next(self._seq)}"
            self._acks[reply] = (round_, i)
            replies.append(reply)
            round_.pending += 1
            signature = self._signature(fields)
            if out.add(
                fields[b"s"], fields[b"b"], reply=reply.encode(), msg_id=fields[b"i"], signature=signature
            ):
                if out.full:
                    await out.send()
                continue
            try:  # what nats-py must see itself (reconnecting, unusual names)
                await out.send()
                if not fits(self._nc, fields[b"b"], fields[b"i"], signature):
                    # Never written so (calls.start bounds what goes for approval; outputs over
                    # the inline limit go by reference): sent, it would close the connection.
                    log.error(
                        "outbox relay: an outbox entry is larger than a NATS message; it stays in the outbox",
                        extra={"msgId": _s(fields[b"i"]), "size": len(fields[b"b"])},
                    )
                    raise MaxPayloadError
                headers = {"Nats-Msg-Id": _s(fields[b"i"])}
                if signature:
                    headers[SIGNATURE_HEADER] = signature.decode()
                await self._nc.publish(_s(fields[b"s"]), fields[b"b"], reply=reply, headers=headers)
            except Exception as exc:  # disconnected with a full buffer, closed: the rest waits
                error = exc
                del self._acks[reply]
                round_.pending -= 1
                break
        await out.send()
        round_.sent()
        deadline = loop.time() + ACK_WAIT
        while not round_.complete:
            now = loop.time()
            left = deadline - now
            if left <= 0:
                break
            if round_.done.done():  # woken by the last slice's timer: wait on a new future
                round_.done = loop.create_future()
            # In slices no longer than the lock's validity, so that a slow ack never lets it lapse.
            timer = loop.call_later(max(0.05, min(left, self._valid_until - now)), round_.wake)
            try:
                await round_.done
            finally:
                timer.cancel()
            if not round_.complete and not await self._fence():
                break
        for reply in replies:  # acks that come later (or never) are dropped
            self._acks.pop(reply, None)
        return round_.results, error

    async def drain(self, within: float) -> None:
        """On shutdown (the relay loop stopped): relay what the outbox holds, for up to `within`
        seconds, if this relay holds the lock (or can take it); then release the lock. What is
        left waits for the next relay (another replica, or this one restarted)."""
        self._running_loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(within):
                self._held.clear()
                cursor = b"0-0"
                while await self._fence():
                    entries = await self._read(cursor, None)
                    if not entries:
                        return
                    cursor = entries[-1][0]
                    _, failed = await self._publish(entries)
                    if failed:
                        return
        except Exception:
            log.warning("outbox relay: entries left in the outbox at shutdown; the next relay sends them")
        finally:
            with contextlib.suppress(Exception):  # not deleted: the next relay sends them again
                async with asyncio.timeout(1.0):
                    await self._delete_acked()
            await self.release()

    def start(self, name: str) -> None:
        """Relay in the background (`run`) until `stop`."""
        self._task = asyncio.create_task(self.run(), name=name)

    async def stop(self, within: float = 2.0) -> None:
        """Stop the background relay, `drain` for up to `within` seconds, and close the relay's own
        connection (`pipe`): what is left waits for the next relay."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        await self.drain(within=within)
        with contextlib.suppress(Exception):
            await self._pipe.aclose()

    async def pending(self) -> int:
        """Entries in the outbox not yet in JetStream (for tests and health)."""
        with contextlib.suppress(ResponseError):
            return int(await self._r.xlen(self._outbox))
        return 0
