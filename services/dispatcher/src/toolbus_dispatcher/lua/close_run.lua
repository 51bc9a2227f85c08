-- Close a run: every call not done ends with the `cancelled` outcome and gives up its slot, lease
-- and queue place; the `RunClosed` command (to the approval and credentials services) is queued in
-- the outbox in the same step, with the message id `runClosed:<runId>`, so it exists once whatever
-- happens after this script. The run's keys then expire after the retention period.
-- Closing a closed run is a retry (the first reply may have been lost): it answers the same (the
-- calls the first close cancelled) and changes nothing; only a run closed before the command went
-- through the outbox has it queued now.
-- The reply subjects still waiting on the cancelled calls (kept 5 minutes; the closer deletes them
-- once it answered them) are handed to one closer: this one claims them (`answering`:
-- owner|until) unless another owner's claim has not run out (it may be publishing them now); a
-- claim of this owner's own is handed again (its process keeps two closes apart), so a dispatcher
-- that died between this script and its replies is mended by the next close of its own, or of
-- anyone once the claim runs out. The claim's clock is Redis's (TIME), so the dispatchers' clocks
-- need not agree.
-- KEYS: run, run_calls, run_keys, run_waiting, run_slots, leases, outbox
-- ARGV: now, cancelledOutcomeJson, callPrefix, repliesPrefix, retentionSeconds, runId,
--       runsClosedSubject, owner, claimSeconds, now, eventsPrefix (the last two are admit.lua's)
local f = redis.call('HMGET', KEYS[1], 'state', 'toolsetId', 'closedQueued', 'cancelledIds', 'answering')
if not f[1] then return {'notFound'} end
local ids = redis.call('SMEMBERS', KEYS[2])
local cancelled = {}
local hand = true
local epoch = redis_now()
if f[5] then
  local owner, till = string.match(f[5], '^(.*)|([^|]*)$')
  hand = owner == ARGV[8] or (tonumber(till) or 0) <= epoch  -- unreadable: lapsed
end
if hand then
  redis.call('HSET', KEYS[1], 'answering', ARGV[8] .. '|' .. (epoch + tonumber(ARGV[9])))
end
local function cancelled_entry(cid)
  local replies = {}
  if hand then
    local rk = ARGV[4] .. cid
    replies = redis.call('LRANGE', rk, 0, -1)
    redis.call('EXPIRE', rk, 300)
  end
  return {cid, replies, redis.call('HGET', ARGV[3] .. cid, 'key') or ''}
end
if f[1] == 'open' then
  redis.call('HSET', KEYS[1], 'state', 'closed', 'closedAt', ARGV[1])
  local cancelled_ids = {}
  for _, cid in ipairs(ids) do
    local ck = ARGV[3] .. cid
    local st = redis.call('HGET', ck, 'state')
    if st and st ~= 'done' then
      release(ck, cid, KEYS[6])
      redis.call('HSET', ck, 'state', 'done', 'outcome', ARGV[2], 'finished', ARGV[1])
      emit(ck, ARGV[6], cid, 'completed', ',"outcome":' .. ARGV[2])
      cancelled[#cancelled + 1] = cancelled_entry(cid)
      cancelled_ids[#cancelled_ids + 1] = cid
    end
    redis.call('EXPIRE', ck, tonumber(ARGV[5]))
  end
  redis.call('HSET', KEYS[1], 'cancelledIds', table.concat(cancelled_ids, ','))
elseif f[4] and f[4] ~= '' then
  for cid in string.gmatch(f[4], '[^,]+') do cancelled[#cancelled + 1] = cancelled_entry(cid) end
end
if not f[3] then
  local quoted = {}
  for i, cid in ipairs(ids) do quoted[i] = cjson.encode(cid) end
  local body = '{"runId":' .. cjson.encode(ARGV[6]) .. ',"toolsetId":' .. cjson.encode(f[2] or '')
    .. ',"callIds":[' .. table.concat(quoted, ',') .. ']}'
  outbox_add(OUTBOX, ARGV[7], 'runClosed:' .. ARGV[6], body)
  redis.call('HSET', KEYS[1], 'closedQueued', '1')
end
if f[1] == 'open' then
  for i = 1, 5 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[5])) end
end
return {f[1] == 'open' and 'closed' or 'alreadyClosed', f[2], ids, cancelled}
