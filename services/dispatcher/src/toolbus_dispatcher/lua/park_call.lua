-- Park a running call this dispatcher owns (its server answered 401): it holds no slot, and the
-- attempt that met the 401 is given back. Its slots go to the next waiting calls. The CallParked
-- command for the credentials service goes into the outbox in the same step (the relay publishes
-- it to the INTERNAL stream, message id `park:<callId>:<n>`): a dispatcher dying right after the
-- park can no longer leave the call parked with nobody told.
-- KEYS: call, leases, outbox
-- ARGV: callId, owner, server, level, now, lease, callPrefix, runLimit, maxScan, CallParked
--       subject, CallParked JSON, now, eventsPrefix (the last two: see admit.lua)
local ck = KEYS[1]
local cid = ARGV[1]
local c = redis.call('HMGET', ck, 'state', 'owner', 'run', 'server', 'level')
if c[1] == 'parked' and c[2] == ARGV[2] and c[4] == ARGV[3] and c[5] == ARGV[4] then
  -- This owner parked it already: a retry after the reply was lost. Same answer (the first run
  -- already put the CallParked command in the outbox), nothing moves.
  return {'parked', handed_back(ck, ARGV[7], ARGV[2])}
end
if c[1] ~= 'running' or c[2] ~= ARGV[2] then return {'stale', {}} end
release(ck, cid, KEYS[2])
redis.call('HINCRBY', ck, 'attempts', -1)
redis.call('HSET', ck, 'state', 'parked', 'server', ARGV[3], 'level', ARGV[4], 'parkedAt', ARGV[5])
emit(ck, c[3], cid, 'parked', ',"server":' .. cjson.encode(ARGV[3]) .. ',"level":' .. cjson.encode(ARGV[4]))
local n = redis.call('HGET', ck, 'evseq')
outbox_add(KEYS[3], ARGV[10], 'park:' .. cid .. ':' .. n, ARGV[11])
local admitted = admit_for(ck, KEYS[2], ARGV[7], ARGV[2], lease_until(ARGV[6]), tonumber(ARGV[8]), tonumber(ARGV[9]))
record_handed(ck, admitted)
return {'parked', admitted}
