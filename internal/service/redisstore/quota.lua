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
--
-- Consumption is what is stored, never what remains, so a limit raised or
-- lowered (an override, another identity limit, a new configuration)
-- applies to the next request. A denied take writes nothing.
--
-- Returns {allowed (1/0), "<units used after> <the limit applied> <the
-- thresholds first crossed by this call, a bitmask> <1 if the override's
-- limit applied, else 0>"}: two values, as tokenbucket.lua returns, which
-- the service reads without a string per number.

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

if mode == 'reset' then
  redis.call('DEL', KEYS[1])
  return {1, '0 ' .. fmt(limit) .. ' 0 ' .. source}
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
  end
elseif mode == 'refund' then
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
return {allowed, fmt(used) .. ' ' .. fmt(limit) .. ' ' .. crossed .. ' ' .. source}
