-- Extend the leases (and slot leases) of the running calls this dispatcher owns, in one batch.
-- Returns the ids of calls that are no longer ours (reaped by another replica, cancelled, done).
-- KEYS: leases
-- ARGV: owner, lease (seconds from now on Redis's clock), callPrefix, callId...
local expiry = lease_until(ARGV[2])
local lost = {}
for i = 4, #ARGV do
  local cid = ARGV[i]
  local ck = ARGV[3] .. cid
  local f = redis.call('HMGET', ck, 'state', 'owner', 'slots', 'tslots')
  if f[1] == 'running' and f[2] == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', expiry, cid)
    redis.call('ZADD', f[3], 'XX', expiry, cid)
    if f[4] and f[4] ~= '' then redis.call('ZADD', f[4], 'XX', expiry, cid) end
  else
    lost[#lost + 1] = cid
  end
end
return lost
