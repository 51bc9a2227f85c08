-- Store a new call durably and try to give it a slot, in one round trip; or, for a repeated
-- idempotency key, return the existing call (registering the invoker's reply subject if the call
-- is not done yet), or `differs` when that call has another tool or input text.
-- KEYS: run, run_keys, run_calls, call, call_replies, run_waiting, run_slots, leases, cred_version,
--       outbox
-- ARGV: callId, idemKey, tool, inputJson, toolsetId, conc, onInterruption, reply, now, lease,
--       owner, approvalId, digest, callPrefix, toolSlotsKey, runLimit, maxScan, repliesPrefix, runId,
--       ApprovalNeeded subject, ApprovalNeeded JSON (both '' without approval), now, eventsPrefix
-- A call that waits for approval has its ApprovalNeeded command put in the outbox here, with the
-- stored call (message id `approvalNeeded:<callId>`, relayed to the INTERNAL stream after the call's
-- `approvalRequested` event).
local run = redis.call('HMGET', KEYS[1], 'state', 'toolsetId', 'namespace')
local credv = redis.call('GET', KEYS[9]) or '0'
if run[1] ~= 'open' then return {'notFound', credv} end
if run[2] ~= ARGV[5] then return {'toolsetChanged', credv} end
local existing = redis.call('HGET', KEYS[2], ARGV[2])
if existing then
  local ck = ARGV[14] .. existing
  local c = redis.call('HMGET', ck, 'state', 'outcome', 'attempts', 'tool', 'input', 'asked')
  c[5] = c[6] or c[5]  -- the input asked about, when a decision sent an edited one
  if c[4] and (c[4] ~= ARGV[3] or c[5] ~= ARGV[4]) then
    -- The key names a call of another tool or input (or the same input written otherwise):
    -- nothing is registered here; the dispatcher compares the two and says which.
    return {'differs', credv, existing, c[4], c[5] or ''}
  end
  if c[1] ~= 'done' and ARGV[8] ~= '' then
    redis.call('RPUSH', ARGV[18] .. existing, ARGV[8])
  end
  -- A repeat after a lost reply: hand over again what the first run admitted (itself included)
  -- and this owner still holds without running it (the dispatcher skips calls it runs already).
  return {'exists', credv, existing, c[1] or 'done', c[2] or '', handed_back(ck, ARGV[14], ARGV[11])}
end
local cid = ARGV[1]
local ck = KEYS[4]
local expiry = lease_until(ARGV[10])
if ARGV[12] == '' and redis.call('ZCARD', KEYS[6]) == 0
    and redis.call('ZCARD', KEYS[7]) < tonumber(ARGV[16])
    and (ARGV[15] == '' or redis.call('ZCARD', ARGV[15]) < tonumber(ARGV[6])) then
  -- The common case: nobody waits in the run and its slots (and the tool's, under a concurrency
  -- limit) have room, so `admit` would take this call at once. The same end state and events as
  -- enqueue + admit below, in one write of the call: running under this owner, attempt 1, its two
  -- events (`evseq` 2) and itself noted as handed (for a retry after a lost reply).
  redis.call('HSET', ck, 'run', ARGV[19], 'tool', ARGV[3], 'input', ARGV[4],
    'key', ARGV[2], 'ts', ARGV[5], 'ns', run[3] or '', 'onint', ARGV[7], 'attempts', 1,
    'slots', KEYS[7], 'tslots', ARGV[15], 'conc', ARGV[6], 'waiting', KEYS[6], 'created', ARGV[9],
    'approval', '', 'digest', ARGV[13], 'state', 'running', 'runkey', KEYS[1], 'owner', ARGV[11],
    'evseq', 2, 'handed', cid)
  redis.call('HSET', KEYS[2], ARGV[2], cid)
  redis.call('SADD', KEYS[3], cid)
  if ARGV[8] ~= '' then redis.call('RPUSH', KEYS[5], ARGV[8]) end
  redis.call('ZADD', KEYS[7], expiry, cid)
  if ARGV[15] ~= '' then redis.call('ZADD', ARGV[15], expiry, cid) end
  redis.call('ZADD', KEYS[8], expiry, cid)
  emit_seq(ARGV[19], cid, 1, 'accepted')
  emit_seq(ARGV[19], cid, 2, 'attemptStarted', ',"attempt":1')
  return {'created', credv, cid, 'running', {{cid, {'self', 1}}}}
end
redis.call('HSET', ck, 'run', ARGV[19], 'tool', ARGV[3], 'input', ARGV[4],
  'key', ARGV[2], 'ts', ARGV[5], 'ns', run[3] or '', 'onint', ARGV[7], 'attempts', 0,
  'slots', KEYS[7], 'tslots', ARGV[15], 'conc', ARGV[6], 'waiting', KEYS[6], 'created', ARGV[9],
  'approval', ARGV[12], 'digest', ARGV[13], 'state', 'queued', 'runkey', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[2], cid)
redis.call('SADD', KEYS[3], cid)
if ARGV[8] ~= '' then redis.call('RPUSH', KEYS[5], ARGV[8]) end
emit(ck, ARGV[19], cid, 'accepted')
if ARGV[12] ~= '' then
  redis.call('HSET', ck, 'state', 'awaitingApproval')
  emit(ck, ARGV[19], cid, 'approvalRequested', ',"approvalId":' .. cjson.encode(ARGV[12]))
  if ARGV[21] ~= '' then
    outbox_add(OUTBOX, ARGV[20], 'approvalNeeded:' .. cid, ARGV[21])
  end
  return {'created', credv, cid, 'awaitingApproval', {}}
end
enqueue(ck, cid)
local admitted = admit(KEYS[6], KEYS[7], KEYS[8], ARGV[14], ARGV[11], expiry, tonumber(ARGV[16]), tonumber(ARGV[17]))
record_handed(ck, admitted)
local state = redis.call('HGET', ck, 'state')
-- The caller knows the call it just created: send back only its attempt number.
for i, item in ipairs(admitted) do
  if item[1] == cid then admitted[i] = {cid, {'self', item[2][8]}} end
end
return {'created', credv, cid, state, admitted}
