-- tokengate-rls: settle one token bucket after the response, atomically
-- (docs/rls.md, "Settling after the response").
--
-- KEYS[1]  the bucket, "tb:{<rule>:<composite key>}" (tokenbucket.lua's)
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  burst, capacity in tokens (> 0)
-- ARGV[3]  max_debt (>= 0): how far below zero a charge may go
-- ARGV[4]  "charge": take ARGV[5] tokens whatever the bucket holds, down to
--          -max_debt (what lies beyond is forgiven; bucket.Limit.Charge);
--          "refund": give ARGV[5] tokens back, capped at burst
--          (bucket.Limit.Refund); "reset": delete the key, which stands
--          for a full bucket (bucket.Limit.Reset)
-- ARGV[5]  the amount, > 0 (ignored by reset)
-- ARGV[6]  optional: the time as "<seconds>.<6 digits>", for tests only;
--          otherwise Redis TIME
--
-- The value, its parsing, the refill and the flooring to 6 decimals are
-- tokenbucket.lua's, step for step (TestSettleScriptMatchesBucket). Each
-- call touches one key. Returns {1, tokens after as a 6-decimal string}.

local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local maxdebt = tonumber(ARGV[3]) or 0
local op = ARGV[4]
local amount = tonumber(ARGV[5]) or 0

if op == 'reset' then
  redis.call('DEL', KEYS[1])
  return {1, string.format('%.6f', burst)}
end
if op ~= 'charge' and op ~= 'refund' then
  return redis.error_reply('settle: unknown op ' .. tostring(op))
end

local nowstr = ARGV[6]
if nowstr == nil or nowstr == '' then
  local t = redis.call('TIME')
  nowstr = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end
local now = tonumber(nowstr)

-- @refill

if amount > 0 then
  if op == 'charge' then
    local floor = -maxdebt
    if amount >= tokens - floor then
      tokens = floor
    else
      tokens = tokens - amount
    end
  elseif amount >= burst - tokens then
    tokens = burst
  else
    tokens = tokens + amount
  end
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

local ttl = math.ceil((burst - stored) / rate * 1000) + 1000
redis.call('SET', KEYS[1], tokstr .. ':' .. string.format('%.6f', last), 'PX', ttl)
return {1, tokstr}
