-- Open a run, or accept opening it again with the same toolset.
-- KEYS: run
-- ARGV: toolsetId, namespace, now
local f = redis.call('HMGET', KEYS[1], 'state', 'toolsetId')
if f[1] then
  if f[1] == 'open' and f[2] == ARGV[1] then return 'open' end
  if f[1] == 'open' then return 'conflict' end
  return 'closed'
end
redis.call('HSET', KEYS[1], 'state', 'open', 'toolsetId', ARGV[1], 'namespace', ARGV[2], 'openedAt', ARGV[3], 'seq', 0)
return 'opened'
