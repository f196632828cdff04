-- tokengate-rls: one token bucket, updated atomically.
--
-- KEYS[1]  the bucket, "tb:{<rule>:<composite key>}"
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  burst, capacity in tokens (> 0)
-- ARGV[3]  cost: > 0 takes that many tokens if the bucket holds them;
--          < 0 gives -cost back (a refund), capped at burst; 0 only reads
-- ARGV[4]  optional: the time as "<seconds>.<6 digits>", for tests only;
--          otherwise (absent or empty) the time is Redis TIME, so that
--          every server replica reads the same clock
-- ARGV[5]  optional: max_debt (>= 0, default 0), how far below zero a
--          settlement (settle.lua) may have taken the tokens of a rule
--          whose cost the response reports; a bucket in debt admits nothing
--
-- The value is "tokens:last_refill", both with exactly 6 decimals, tokens
-- floored (sharedstate's codec); the arithmetic is bucket.Limit's
-- continuous bucket step for step, in IEEE doubles as in Go. A value that
-- does not parse is a full bucket. A rejection writes nothing; a write sets
-- the TTL to the time the bucket takes to be full again plus 1 s, after
-- which a missing key and the full bucket it stood for are the same.
--
-- Returns {allowed (1/0), tokens after the decision as a 6-decimal string}.

local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

-- KEYS[2], when given and named "ov:" (store.go, Op.Override; otherwise
-- it is a receipt, below): the key's override hash
-- "ov:{<rule>:<composite key>}", read in this call so that every replica
-- applies an override on the next request; its rate and burst, when
-- numbers > 0, replace ARGV[1] and ARGV[2].
if KEYS[2] and string.sub(KEYS[2], 1, 3) == 'ov:' then
  local o = redis.call('HMGET', KEYS[2], 'rate', 'burst')
  local r, b = tonumber(o[1]), tonumber(o[2])
  if r and r > 0 then rate = r end
  if b and b > 0 then burst = b end
end

local maxdebt = tonumber(ARGV[5]) or 0

local nowstr = ARGV[4]

-- @refill

-- Decide (bucket.Limit.Take / Refund). The service has no reservation
-- (bucket.Limit.Reserve is 0: it answers at once, and the filter refuses
-- max_reserved in rls_descriptors), so a cost passes only if the bucket
-- holds it, and a bucket in debt admits nothing.
local allowed = 1
if cost < 0 then
  local c = -cost
  if c >= burst - tokens then
    tokens = burst
  else
    tokens = tokens + c
  end
elseif tokens >= cost then
  tokens = tokens - cost
else
  allowed = 0
end

-- @store

if allowed == 1 and cost ~= 0 then
  save()
end

-- Receipts (docs/rls.md#receipts). A take of a rule that settles, for a
-- stream that sent its id, adds what it took to the stream's receipt: the
-- further key "<KEYS[1]>:r:<id>", the only other key whose name starts
-- with "tb:". settle.lua gives the stream back no more than its receipt
-- holds. A refund of this call's own take (cost < 0) takes it off again.
-- The receipt lives 15 minutes from its last take (as settle.lua's
-- writes of it).
if allowed == 1 and cost ~= 0 then
  for i = 2, #KEYS do
    local rk = KEYS[i]
    if string.sub(rk, 1, 3) == 'tb:' and (cost < 0 or
        not redis.call('SET', rk, ARGV[3], 'NX', 'PX', '900000')) then
      local r = (tonumber(redis.call('GET', rk)) or 0) + cost
      if r > 0 then
        redis.call('SET', rk, string.format('%.17g', r), 'PX', '900000')
      else
        redis.call('DEL', rk)
      end
    end
  end
end
return {allowed, tokstr}
