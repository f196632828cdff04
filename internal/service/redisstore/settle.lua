-- tokengate-rls: settle one token bucket after the response, atomically
-- (docs/rls.md, "Settling after the response").
--
-- KEYS[1]  the bucket, "tb:{<rule>:<composite key>}" (tokenbucket.lua's)
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  burst, capacity in tokens (> 0)
-- ARGV[3]  the rule's debt bound (bucket.Limit.MaxDebt): for a rule that
--          settles, the storage bound 1e12, since a reported cost is
--          carried in full (no configuration sets a floor; max_debt is
--          refused)
-- ARGV[4]  "charge": take ARGV[5] tokens whatever the bucket holds, in
--          full down to that bound (bucket.Limit.Charge);
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

-- @store

save()
return {1, tokstr}
