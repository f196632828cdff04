-- tokengate-rls: the part tokenbucket.lua and settle.lua share, put in
-- place of their line "-- @refill" when the store loads them (store.go,
-- withRefill): read the bucket at KEYS[1] and refill it to now.
--
-- Before it: rate, burst, maxdebt (>= 0) and now (seconds, a double).
-- After it: tokens and last, the bucket refilled to now (bucket.Limit.Refill
-- step for step, in IEEE doubles as in Go). A value that does not parse is
-- a full bucket.

local tokens, last = burst, now
local v = redis.call('GET', KEYS[1])
if v then
  local a, b = string.match(v, '^(%-?%d+%.?%d*):(%d+%.?%d*)$')
  tokens, last = tonumber(a), tonumber(b)
  if tokens == nil or last == nil or last <= 0 then
    tokens, last = burst, now
  end
end

-- Refill (bucket.Limit.Refill).
if tokens > burst then
  tokens = burst
elseif tokens < -maxdebt then
  tokens = -maxdebt
end
if now < last then
  -- The clock went back: within MaxClockSkew (1 s) keep last, beyond it
  -- restart from now; refill nothing either way.
  if last - now > 1.0 then
    last = now
  end
else
  local elapsed = now - last
  if elapsed > 0 and tokens < burst then
    local add = elapsed * rate
    if add >= burst - tokens then
      tokens = burst
    elseif add > 0 then
      tokens = tokens + add
      if tokens > burst then
        tokens = burst
      end
    end
  end
  last = now
end
