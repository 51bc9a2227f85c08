-- Move a call out of a holding state (`awaitingApproval` or `parked`) into the slot queue, or end
-- it there with an outcome. Nothing happens unless the call is still in `fromState` and, for an
-- approval, the decision is for this very call, tool, toolset and input.
-- KEYS: call, call_replies, leases, outbox
-- ARGV: callId, fromState, outcomeJson ('' to queue), owner, now, lease, callPrefix, runLimit,
--       maxScan, approvalId, tool, toolsetId, digest (these four '' when not an approval),
--       reason (of a denial), editedInputJson, editedDigest ('' when not edited), decider
--       ('' when unknown), now, eventsPrefix
-- An edited input replaces `input` (what is sent); the one asked about is kept as `asked`, which
-- a repeated idempotency key is compared with.
local ck = KEYS[1]
local cid = ARGV[1]
local c = redis.call('HMGET', ck, 'state', 'approval', 'tool', 'ts', 'digest', 'run', 'key')
if c[1] == 'done' and ARGV[3] ~= '' and redis.call('HGET', ck, 'outcome') == ARGV[3] then
  -- This very outcome ended it: a retry after the reply was lost. Same answer: who waits (kept
  -- 5 minutes), so they are answered again.
  return {'done', redis.call('LRANGE', KEYS[2], 0, -1), {}, c[6], c[7]}
end
if c[1] ~= ARGV[2] then
  -- Moved on already: a stale decision or resume, or a retry of this script after its reply was
  -- lost. Either way nothing moves; what a first run admitted and this owner holds without
  -- running it is handed back (the dispatcher starts only those it does not run).
  return {'skipped', {}, handed_back(ck, ARGV[7], ARGV[4]), c[6] or '', c[7] or ''}
end
if ARGV[10] ~= '' then
  if c[2] ~= ARGV[10] or c[3] ~= ARGV[11] or c[4] ~= ARGV[12] or c[5] ~= ARGV[13] then
    return {'mismatch', {}, {}, '', ''}
  end
end
local approval = ARGV[10] ~= '' and (',"approvalId":' .. cjson.encode(ARGV[10])) or ''
if ARGV[17] ~= '' then approval = approval .. ',"decider":' .. cjson.encode(ARGV[17]) end
if ARGV[3] ~= '' then
  redis.call('HSET', ck, 'state', 'done', 'outcome', ARGV[3], 'finished', ARGV[5])
  if ARGV[2] == 'awaitingApproval' then
    emit(ck, c[6], cid, 'denied', approval .. (ARGV[14] ~= '' and (',"reason":' .. cjson.encode(ARGV[14])) or ''))
  end
  emit(ck, c[6], cid, 'completed', ',"outcome":' .. ARGV[3])
  local replies = redis.call('LRANGE', KEYS[2], 0, -1)
  redis.call('EXPIRE', KEYS[2], 300)  -- kept a while for a retry of this script
  return {'done', replies, {}, c[6], c[7]}
end
if ARGV[15] ~= '' then
  redis.call('HSET', ck, 'asked', redis.call('HGET', ck, 'input'), 'input', ARGV[15], 'editedDigest', ARGV[16])
  approval = approval .. ',"inputDigest":' .. cjson.encode(c[5]) .. ',"editedInputDigest":' .. cjson.encode(ARGV[16])
end
emit(ck, c[6], cid, ARGV[2] == 'awaitingApproval' and 'approved' or 'resumed', approval)
enqueue(ck, cid)
local admitted = admit_for(ck, KEYS[3], ARGV[7], ARGV[4], lease_until(ARGV[6]), tonumber(ARGV[8]), tonumber(ARGV[9]))
record_handed(ck, admitted)
return {'queued', {}, admitted, c[6], c[7]}
