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

local maxdebt = tonumber(ARGV[5]) or 0

local nowstr = ARGV[4]
local fromtime = false
if nowstr == nil or nowstr == '' then
  local t = redis.call('TIME')
  -- The microseconds zero-padded to 6 digits.
  nowstr = t[1] .. '.' .. string.sub('00000' .. t[2], -6)
  fromtime = true
end
local now = tonumber(nowstr)

-- @refill

-- Decide (bucket.Limit.Take / Refund).
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

-- Store with 6 decimals as sharedstate.AppendState does: tokens floored
-- (floorMicro; whole tokens from 2^53 microtokens on), a debt rounded up
-- to the microtoken, so that storing never admits more than the bucket
-- holds.
local micro = 1e6
local function floormicro(x)
  local n = math.floor(x * micro)
  if (n + 1) / micro <= x then
    n = n + 1
  elseif n > 0 and n / micro > x then
    n = n - 1
  end
  return n / micro
end
local stored
if tokens < 0 and tokens > -9007199254740992 / micro then
  local d = floormicro(-tokens)
  if d < -tokens then
    d = (math.floor(d * micro + 0.5) + 1) / micro
  end
  stored = -d
elseif not (tokens > 0) then
  stored = 0
elseif tokens * micro >= 9007199254740992 then
  stored = math.floor(tokens)
else
  stored = floormicro(tokens)
end
local tokstr = string.format('%.6f', stored)
if stored == 0 then
  tokstr = '0.000000'
end

if allowed == 1 and cost ~= 0 then
  local ttl = math.ceil((burst - stored) / rate * 1000) + 1000
  -- last is now but when the clock went back. Then TIME's own text is
  -- what '%.6f' would write (until 2106 the doubles near now are closer
  -- together than 5e-7), and formatting a double is the script's dearest
  -- step: about 8 % of its cost in Redis.
  local laststr = nowstr
  if not (fromtime and last == now) then
    laststr = string.format('%.6f', last)
  end
  redis.call('SET', KEYS[1], tokstr .. ':' .. laststr, 'PX', ttl)
end
return {allowed, tokstr}
