-- Count one more attempt of a running call this dispatcher owns; 0 when it is no longer ours.
-- KEYS: call
-- ARGV: owner
local c = redis.call('HMGET', KEYS[1], 'state', 'owner')
if c[1] ~= 'running' or c[2] ~= ARGV[1] then return 0 end
return redis.call('HINCRBY', KEYS[1], 'attempts', 1)
