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

-- KEYS[2], when given (store.go, Op.Override): the key's override hash
-- "ov:{<rule>:<composite key>}", read in this call so that every replica
-- applies an override on the next request; its rate and burst, when
-- numbers > 0, replace ARGV[1] and ARGV[2].
if KEYS[2] then
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
return {allowed, tokstr}
