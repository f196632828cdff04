-- tokengate-rls: the second part tokenbucket.lua and settle.lua share, put
-- in place of their line "-- @store" (store.go, withParts), after
-- refill.lua's part and the script's own decision.
--
-- Before it: tokens, the bucket after the decision, and refill.lua's names.
-- After it: stored and tokstr, the tokens as stored; save(), which writes
-- the bucket with a TTL of the time it takes to be full again plus 1 s,
-- after which a missing key and the full bucket it stood for are the same.

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

local function save()
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
