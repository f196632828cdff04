-- tokengate-rls: settle one token bucket after the response, atomically
-- (docs/rls.md, "Settling after the response").
--
-- KEYS[1]  the bucket, "tb:{<rule>:<composite key>}" (tokenbucket.lua's)
-- KEYS[2]  optional: the stream's receipt, "<KEYS[1]>:r:<id>": the
--          tokens the stream took from the bucket (tokenbucket.lua adds
--          each take) and was not given back (docs/rls.md#receipts).
--          With it a refund gives back at most the receipt and takes what
--          it asked off it, a reset needs a receipt above 0 and deletes
--          it, a charge adds what it took. The service always passes one
--          (an id the stream never took with holds 0); without it (tests
--          of the arithmetic) a refund is capped at burst only.
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
-- call touches one bucket. Returns {1, tokens after as a 6-decimal
-- string, 1 when the receipt cut the settlement (else 0)}.

local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local maxdebt = tonumber(ARGV[3]) or 0
local op = ARGV[4]
local amount = tonumber(ARGV[5]) or 0

if op ~= 'charge' and op ~= 'refund' and op ~= 'reset' then
  return redis.error_reply('settle: unknown op ' .. tostring(op))
end
local rk = KEYS[2]
local receipt
if rk then
  receipt = tonumber(redis.call('GET', rk)) or 0
end
if op == 'reset' and (not rk or receipt > 0) then
  redis.call('DEL', KEYS[1])
  if rk then
    redis.call('DEL', rk)
  end
  return {1, string.format('%.6f', burst), 0}
end

local nowstr = ARGV[6]

-- @refill

local cut = 0
if op == 'reset' then
  amount, cut = 0, 1 -- no receipt: the bucket stays as it is
elseif op == 'refund' and rk and amount > receipt then
  amount, cut = receipt, 1
end
local before = tokens

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

if amount > 0 then
  save()
  if rk then
    if op == 'charge' then
      receipt = receipt + (before - tokens)
    else
      receipt = receipt - amount
    end
    if receipt > 0 then
      redis.call('SET', rk, string.format('%.17g', receipt), 'PX', '900000')
    else
      redis.call('DEL', rk)
    end
  end
end
return {1, tokstr, cut}
