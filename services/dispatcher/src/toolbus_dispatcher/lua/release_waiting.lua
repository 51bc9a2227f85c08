-- Move a call out of a holding state (`awaitingApproval` or `parked`) into the slot queue, or end
-- it there with an outcome. Nothing happens unless the call is still in `fromState` and, for an
-- approval, the decision is for this very call, tool, toolset and input.
-- KEYS: call, call_replies, leases, outbox
-- ARGV: callId, fromState, outcomeJson ('' to queue), owner, now, expiry, callPrefix, runLimit,
--       maxScan, approvalId, tool, toolsetId, digest (these four '' when not an approval),
--       reason (of a denial), now, eventsPrefix
local ck = KEYS[1]
local cid = ARGV[1]
local c = redis.call('HMGET', ck, 'state', 'approval', 'tool', 'ts', 'digest', 'run', 'key')
if c[1] ~= ARGV[2] then return {'skipped', {}, {}, '', ''} end
if ARGV[10] ~= '' then
  if c[2] ~= ARGV[10] or c[3] ~= ARGV[11] or c[4] ~= ARGV[12] or c[5] ~= ARGV[13] then
    return {'mismatch', {}, {}, '', ''}
  end
end
local approval = ARGV[10] ~= '' and (',"approvalId":' .. cjson.encode(ARGV[10])) or ''
if ARGV[3] ~= '' then
  redis.call('HSET', ck, 'state', 'done', 'outcome', ARGV[3], 'finished', ARGV[5])
  if ARGV[2] == 'awaitingApproval' then
    emit(ck, c[6], cid, 'denied', approval .. (ARGV[14] ~= '' and (',"reason":' .. cjson.encode(ARGV[14])) or ''))
  end
  emit(ck, c[6], cid, 'completed', ',"outcome":' .. ARGV[3])
  return {'done', pop_replies(KEYS[2]), {}, c[6], c[7]}
end
emit(ck, c[6], cid, ARGV[2] == 'awaitingApproval' and 'approved' or 'resumed', approval)
enqueue(ck, cid)
local admitted = admit_for(ck, KEYS[3], ARGV[7], ARGV[4], ARGV[6], tonumber(ARGV[8]), tonumber(ARGV[9]))
return {'queued', {}, admitted, c[6], c[7]}
