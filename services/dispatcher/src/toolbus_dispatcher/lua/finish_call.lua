-- Finish a running call this dispatcher owns: store its outcome, free its slots and lease, hand
-- them to the next waiting calls of the run. A call no longer ours (reaped, cancelled) is left
-- alone: the result of an attempt that is no longer current is dropped.
-- KEYS: call, call_replies, leases
-- ARGV: callId, owner, outcomeJson, now, expiry, callPrefix, runLimit, maxScan
local ck = KEYS[1]
local cid = ARGV[1]
local c = redis.call('HMGET', ck, 'state', 'owner')
if c[1] ~= 'running' or c[2] ~= ARGV[2] then return {'stale', {}, {}} end
release(ck, cid, KEYS[3])
redis.call('HSET', ck, 'state', 'done', 'outcome', ARGV[3], 'finished', ARGV[4])
local replies = pop_replies(KEYS[2])
local admitted = admit_for(ck, KEYS[3], ARGV[6], ARGV[2], ARGV[5], tonumber(ARGV[7]), tonumber(ARGV[8]))
return {'done', replies, admitted}
