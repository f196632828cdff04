-- tokengate-rls: the first part tokenbucket.lua and settle.lua share, put
-- in place of their line "-- @refill" when the store loads them (store.go,
-- withParts): read the time and the bucket at KEYS[1], and refill it to now.
--
-- Before it: rate, burst, maxdebt (>= 0), and nowstr: a test's time
-- ("<seconds>.<6 digits>"), or nil or empty for Redis TIME.
-- After it: nowstr and now (the time as text and as a double), fromtime
-- (it came from TIME), and tokens and last, the bucket refilled to now
-- (bucket.Limit.Refill step for step, in IEEE doubles as in Go). A value
-- that does not parse is a full bucket.

local fromtime = false
if nowstr == nil or nowstr == '' then
  local t = redis.call('TIME')
  -- The microseconds zero-padded to 6 digits.
  nowstr = t[1] .. '.' .. string.sub('00000' .. t[2], -6)
  fromtime = true
end
local now = tonumber(nowstr)

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
