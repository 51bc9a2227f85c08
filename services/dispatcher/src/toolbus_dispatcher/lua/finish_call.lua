-- Finish a running call this dispatcher owns: store its outcome, free its slots and lease, hand
-- them to the next waiting calls of the run. A call no longer ours (reaped, cancelled) is left
-- alone: the result of an attempt that is no longer current is dropped.
-- KEYS: call, call_replies, leases, outbox
-- ARGV: callId, owner, outcomeJson, now, lease, callPrefix, runLimit, maxScan, now, eventsPrefix
local ck = KEYS[1]
local cid = ARGV[1]
local c = redis.call('HMGET', ck, 'state', 'owner', 'run', 'finisher', 'slots', 'tslots', 'waiting', 'evseq')
if c[1] == 'done' and c[4] == ARGV[2] then
  -- This owner finished it already: a retry after the reply was lost. Same answer, nothing moves;
  -- the calls the first run admitted into the freed slots are handed over again.
  return {'done', redis.call('LRANGE', KEYS[2], 0, -1), handed_back(ck, ARGV[6], ARGV[2])}
end
if c[1] ~= 'running' or c[2] ~= ARGV[2] then return {'stale', {}, {}} end
-- `release` without its read (the fields came with the check above) and without the queue: a
-- running call is in no slot queue (`admit` took it out when it gave it its slot).
redis.call('ZREM', c[5], cid)
if c[6] and c[6] ~= '' then redis.call('ZREM', c[6], cid) end
redis.call('ZREM', KEYS[3], cid)
local n = tonumber(c[8] or '0') + 1
redis.call('HSET', ck, 'state', 'done', 'outcome', ARGV[3], 'finished', ARGV[4], 'finisher', ARGV[2], 'evseq', n)
emit_seq(c[3], cid, n, 'completed', ',"outcome":' .. ARGV[3])
-- Kept a little while (not deleted) so that a retry of this script still finds who waits.
local replies = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('EXPIRE', KEYS[2], 300)
local admitted = admit(c[7], c[5], KEYS[3], ARGV[6], ARGV[2], lease_until(ARGV[5]), tonumber(ARGV[7]), tonumber(ARGV[8]))
record_handed(ck, admitted)
return {'done', replies, admitted}
