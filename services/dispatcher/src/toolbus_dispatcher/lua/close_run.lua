-- Close a run: every call not done ends with the `cancelled` outcome and gives up its slot, lease
-- and queue place. The run's keys then expire after the retention period.
-- KEYS: run, run_calls, run_keys, run_waiting, run_slots, leases, outbox
-- ARGV: now, cancelledOutcomeJson, callPrefix, repliesPrefix, retentionSeconds, runId, now,
--       eventsPrefix
local f = redis.call('HMGET', KEYS[1], 'state', 'toolsetId')
if not f[1] then return {'notFound'} end
local ids = redis.call('SMEMBERS', KEYS[2])
local cancelled = {}
if f[1] == 'open' then
  redis.call('HSET', KEYS[1], 'state', 'closed', 'closedAt', ARGV[1])
  for _, cid in ipairs(ids) do
    local ck = ARGV[3] .. cid
    local st = redis.call('HGET', ck, 'state')
    if st and st ~= 'done' then
      release(ck, cid, KEYS[6])
      redis.call('HSET', ck, 'state', 'done', 'outcome', ARGV[2], 'finished', ARGV[1])
      emit(ck, ARGV[6], cid, 'completed', ',"outcome":' .. ARGV[2])
      cancelled[#cancelled + 1] = {cid, pop_replies(ARGV[4] .. cid), redis.call('HGET', ck, 'key')}
    end
    redis.call('EXPIRE', ck, tonumber(ARGV[5]))
  end
  for i = 1, 5 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[5])) end
end
return {f[1] == 'open' and 'closed' or 'alreadyClosed', f[2], ids, cancelled}
