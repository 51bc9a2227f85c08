-- Claim running calls whose lease expired (their dispatcher died or stalled): this dispatcher
-- becomes their owner, keeps their slots under a fresh lease, and treats their attempt as
-- interrupted. Atomic, so two replicas never claim the same call.
-- KEYS: leases
-- ARGV: owner, lease, callPrefix, limit; leases run out and are renewed on Redis's clock
local now = redis_now()
local expiry = now + tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
for _, cid in ipairs(ids) do
  local ck = ARGV[3] .. cid
  local f = redis.call('HMGET', ck, 'state', 'slots', 'tslots')
  if f[1] ~= 'running' then
    redis.call('ZREM', KEYS[1], cid)
  else
    redis.call('ZADD', KEYS[1], expiry, cid)
    redis.call('ZADD', f[2], expiry, cid)
    if f[3] and f[3] ~= '' then redis.call('ZADD', f[3], expiry, cid) end
    redis.call('HSET', ck, 'owner', ARGV[1])
    out[#out + 1] = {cid, call_fields(ck)}
  end
end
return out
