-- Open a run, or accept opening it again with the same toolset (and the same namespace, if given).
-- KEYS: run
-- ARGV: toolsetId, namespace ('' for none), now
local f = redis.call('HMGET', KEYS[1], 'state', 'toolsetId', 'namespace')
if f[1] then
  if f[1] ~= 'open' then return 'closed' end
  if f[2] ~= ARGV[1] then return 'conflict' end
  if ARGV[2] ~= '' and (f[3] or '') ~= ARGV[2] then return 'namespace' end
  return 'open'
end
redis.call('HSET', KEYS[1], 'state', 'open', 'toolsetId', ARGV[1], 'namespace', ARGV[2], 'openedAt', ARGV[3], 'seq', 0)
return 'opened'
