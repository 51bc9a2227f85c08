-- Every script that changes a call writes the event of that change in the same script, into the
-- outbox stream (the last KEY; `outbox_add`, toolbus_common.outbox) for the relay to publish with the message id
-- `<callId>:<n>`, so the stream's events always agree with the state, each once. The last two ARGV
-- of such a script are the event time and the call-events subject prefix (`<P>.events.calls.`).
local OUTBOX = KEYS[#KEYS]
local NOW = ARGV[#ARGV - 1]
local EVENTS = ARGV[#ARGV]

-- Redis's clock, in seconds: leases and claims are written and judged by it, not by each
-- dispatcher's (the replicas' clocks need not agree).
local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- When a lease of `seconds` (a script's `lease` ARGV) taken now runs out, on Redis's clock.
local function lease_until(seconds)
  return redis_now() + tonumber(seconds)
end

-- Queue the event number `seq` of a call (its `evseq` already counts it: the caller wrote it).
local function emit_seq(run, cid, seq, typ, extra)
  local body = '{"type":"' .. typ .. '","callId":"' .. cid .. '","runId":"' .. run .. '","at":"' .. NOW .. '"'
    .. (extra or '') .. '}'
  outbox_add(OUTBOX, EVENTS .. run .. '.' .. cid, cid .. ':' .. seq, body)
end

-- Queue the event `typ` of a call; `extra` is more JSON members (',"attempt":2') or nil.
local function emit(ck, run, cid, typ, extra)
  emit_seq(run, cid, redis.call('HINCRBY', ck, 'evseq', 1), typ, extra)
end

-- The fields a dispatcher needs to run a call (CallRecord), in this order.
local function call_fields(ck)
  return redis.call('HMGET', ck, 'run', 'tool', 'input', 'key', 'ts', 'ns', 'onint', 'attempts', 'state')
end

-- Shared by every script that frees a slot or queues a call: admit waiting calls of one run, first
-- come first served, into free slots. A call blocked only by its tool's `concurrency` is skipped,
-- so it never blocks calls of other tools behind it. Admitted calls become `running`, owned by
-- `owner`, with their attempt counter raised (the attempt starts now) and a lease until `expiry`
-- (a time on Redis's clock: `lease_until`).
-- Returns {callId, call_fields} per admitted call.
local function admit(waiting_key, slots_key, leases_key, call_prefix, owner, expiry, run_limit, max_scan)
  local admitted = {}
  local waiting = redis.call('ZRANGE', waiting_key, 0, max_scan - 1)
  if #waiting == 0 then return admitted end
  local running = redis.call('ZCARD', slots_key)
  if running >= run_limit then return admitted end
  local full = {}
  for _, cid in ipairs(waiting) do
    if running >= run_limit then break end
    local ck = call_prefix .. cid
    local f = redis.call('HMGET', ck, 'tslots', 'conc', 'state')
    if not f[3] or f[3] ~= 'waitingSlot' then
      redis.call('ZREM', waiting_key, cid)
    else
      local tkey = f[1]
      local ok = true
      if tkey and tkey ~= '' then
        if full[tkey] then
          ok = false
        elseif redis.call('ZCARD', tkey) >= tonumber(f[2]) then
          full[tkey] = true
          ok = false
        end
      end
      if ok then
        redis.call('ZREM', waiting_key, cid)
        redis.call('ZADD', slots_key, expiry, cid)
        if tkey and tkey ~= '' then redis.call('ZADD', tkey, expiry, cid) end
        redis.call('ZADD', leases_key, expiry, cid)
        redis.call('HSET', ck, 'state', 'running', 'owner', owner)
        redis.call('HINCRBY', ck, 'attempts', 1)
        running = running + 1
        local fields = call_fields(ck)
        emit(ck, fields[1], cid, 'attemptStarted', ',"attempt":' .. fields[8])
        admitted[#admitted + 1] = {cid, fields}
      end
    end
  end
  return admitted
end

-- Remove a call from its slots and lease.
local function release(ck, cid, leases_key)
  local f = redis.call('HMGET', ck, 'slots', 'tslots', 'waiting')
  if f[1] then redis.call('ZREM', f[1], cid) end
  if f[2] and f[2] ~= '' then redis.call('ZREM', f[2], cid) end
  if f[3] then redis.call('ZREM', f[3], cid) end
  redis.call('ZREM', leases_key, cid)
end

-- Pop every reply subject waiting for the call's outcome.
local function pop_replies(replies_key)
  local replies = redis.call('LRANGE', replies_key, 0, -1)
  redis.call('DEL', replies_key)
  return replies
end

-- Queue a call for a slot, behind every call already waiting in its run.
local function enqueue(ck, cid)
  local f = redis.call('HMGET', ck, 'waiting', 'runkey')
  local seq = redis.call('HINCRBY', f[2], 'seq', 1)
  redis.call('ZADD', f[1], seq, cid)
  redis.call('HSET', ck, 'state', 'waitingSlot')
end

-- Admit waiting calls of the run a call belongs to.
local function admit_for(ck, leases_key, call_prefix, owner, expiry, run_limit, max_scan)
  local f = redis.call('HMGET', ck, 'waiting', 'slots')
  return admit(f[1], f[2], leases_key, call_prefix, owner, expiry, run_limit, max_scan)
end

-- Remember which calls a script run admitted (`handed` on the call whose change freed the slots),
-- so that a retry of that script after its reply was lost hands them over again: otherwise they
-- would sit `running` under this owner with nobody running them until their lease lapsed.
local function record_handed(ck, admitted)
  if #admitted == 0 then return end
  local ids = {}
  for i, item in ipairs(admitted) do ids[i] = item[1] end
  redis.call('HSET', ck, 'handed', table.concat(ids, ','))
end

-- For a retry: the calls `record_handed` noted that are still `running` under `owner`, in the form
-- `admit` returns (the dispatcher starts those it does not run already).
local function handed_back(ck, call_prefix, owner)
  local out = {}
  local list = redis.call('HGET', ck, 'handed')
  if not list or list == '' then return out end
  for cid in string.gmatch(list, '[^,]+') do
    local hk = call_prefix .. cid
    local f = redis.call('HMGET', hk, 'state', 'owner')
    if f[1] == 'running' and f[2] == owner then out[#out + 1] = {cid, call_fields(hk)} end
  end
  return out
end
