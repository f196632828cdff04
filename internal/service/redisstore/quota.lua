-- tokengate-rls: one calendar quota's consumption in one period, updated
-- atomically (docs/rls.md, "Quotas").
--
-- KEYS[1]  the period's consumption, "qt:{<rule>:<composite key>}:<period
--          start, unix seconds>": a hash, u = the units consumed (a
--          decimal), t = the bitmask of the thresholds already crossed
-- KEYS[2]  the key's override, "ov:{<rule>:<composite key>}": a hash whose
--          field limit, when a number >= 0, replaces ARGV[1]
-- ARGV[1]  the limit: the rule's, or the identity's bounded by max_limit
-- ARGV[2]  the mode: "take" (admit ARGV[3] units if they fit under the
--          limit, else change nothing), "charge" (add them whatever the
--          limit: a cost the response reported), "refund" (give them
--          back, never below zero), "reset" (delete the period's
--          consumption), "read" (change nothing)
-- ARGV[3]  the units, >= 0
-- ARGV[4]  the consumption's time to live, seconds: to the period's end,
--          plus an hour, plus the key's jitter (the caller's; relative, so
--          that Redis's clock and the service's need not agree)
-- ARGV[5]  a refund's thresholds to forget (a bitmask): those its take
--          crossed, when the service gives back a request another rule
--          refused, so that they are reported when crossed for real
-- ARGV[6..] the thresholds, ascending shares of the limit in (0, 1)
-- KEYS[3]  optional: the stream's receipt, "<KEYS[1]>:r:<id>" (receipts,
--          docs/rls.md#receipts): the units the stream's takes and charges
--          added to this period's consumption and were not given back.
--          With it a take or a charge adds what it added (one SET NX
--          more), a refund gives back at most what the receipt holds and
--          takes what it gave back off it, a reset gives back what the
--          receipt holds (not the whole period) and deletes it. The
--          service passes one to every settlement (an id no take wrote
--          holds 0, so a refund or reset without a valid id gives nothing
--          back) and to the takes of rules that settle whose call has an
--          id; without it (tests of the arithmetic, the admin's own calls)
--          a refund is bounded by zero consumption only, a reset deletes
--          the period's consumption. The receipt names the period (its key
--          is the period's key): a settlement that lands in the next period
--          finds no receipt there and gives nothing back.
--
-- Consumption is what is stored, never what remains, so a limit raised or
-- lowered (an override, another identity limit, a new configuration)
-- applies to the next request. A denied take writes nothing.
--
-- Returns {allowed (1/0), "<units used after> <the limit applied> <the
-- thresholds first crossed by this call, a bitmask> <1 if the override's
-- limit applied, else 0>", 1 when the receipt cut a refund or a reset
-- (else 0)}: as tokenbucket.lua's and settle.lua's, which the service
-- reads without a string per number.

local function fmt(x)
  return string.format('%.17g', x)
end

local limit = tonumber(ARGV[1])
local mode = ARGV[2]
local units = tonumber(ARGV[3]) or 0
local source = 0
local ov = tonumber(redis.call('HGET', KEYS[2], 'limit'))
if ov and ov >= 0 then
  limit, source = ov, 1
end

local rk = KEYS[3]

-- setReceipt stores r as the receipt (deleted at 0): it lives 15 minutes
-- from its last write, as a token bucket's (tokenbucket.lua).
local function setReceipt(r)
  if r > 0 then
    redis.call('SET', rk, fmt(r), 'PX', '900000')
  else
    redis.call('DEL', rk)
  end
end

local cut = 0
if mode == 'reset' then
  if not rk then
    redis.call('DEL', KEYS[1])
    return {1, '0 ' .. fmt(limit) .. ' 0 ' .. source, 0}
  end
  -- A stream's reset gives back what its receipt holds: what that
  -- stream consumed in this period, not what the others did.
  mode, units = 'refund', tonumber(redis.call('GET', rk)) or 0
  if units <= 0 then
    cut = 1
  end
end

local h = redis.call('HMGET', KEYS[1], 'u', 't')
local used = tonumber(h[1]) or 0
local bits = tonumber(h[2]) or 0
local allowed, crossed = 1, 0

if mode == 'take' or mode == 'charge' then
  if mode == 'take' and used + units > limit then
    allowed = 0
  elseif units > 0 then
    used = used + units
    -- Thresholds crossed for the first time this period.
    local bit = 1
    for i = 6, #ARGV do
      if bits % (bit * 2) < bit and used >= tonumber(ARGV[i]) * limit then
        bits, crossed = bits + bit, crossed + bit
      end
      bit = bit * 2
    end
    redis.call('HSET', KEYS[1], 'u', fmt(used), 't', bits)
    redis.call('EXPIRE', KEYS[1], ARGV[4])
    if rk and not redis.call('SET', rk, ARGV[3], 'NX', 'PX', '900000') then
      setReceipt((tonumber(redis.call('GET', rk)) or 0) + units)
    end
  end
elseif mode == 'refund' then
  if rk and cut == 0 then
    local receipt = tonumber(redis.call('GET', rk)) or 0
    if units > receipt then
      units, cut = receipt, 1
    end
    if units > 0 then
      setReceipt(receipt - units)
    end
  end
  if h[1] and units > 0 then
    used = used - units
    if used < 0 then
      used = 0
    end
    local forget = tonumber(ARGV[5]) or 0
    local bit = 1
    while bit <= forget do
      if forget % (bit * 2) >= bit and bits % (bit * 2) >= bit then
        bits = bits - bit
      end
      bit = bit * 2
    end
    redis.call('HSET', KEYS[1], 'u', fmt(used), 't', bits)
  end
elseif mode ~= 'read' then
  return redis.error_reply('quota: unknown mode ' .. tostring(mode))
end
return {allowed, fmt(used) .. ' ' .. fmt(limit) .. ' ' .. crossed .. ' ' .. source, cut}
