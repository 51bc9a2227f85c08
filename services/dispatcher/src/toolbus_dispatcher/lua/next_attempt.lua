-- Count one more attempt of a running call this dispatcher owns; 0 when it is no longer ours.
-- KEYS: call, outbox
-- ARGV: owner, callId, now, eventsPrefix
local c = redis.call('HMGET', KEYS[1], 'state', 'owner', 'run')
if c[1] ~= 'running' or c[2] ~= ARGV[1] then return 0 end
local n = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
emit(KEYS[1], c[3], ARGV[2], 'attemptStarted', ',"attempt":' .. n)
return n
