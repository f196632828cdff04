-- tokengate-rls: one RLQS bucket split among Envoy processes as shares of
-- its rate and burst (docs/rlqs.md), updated atomically.
--
-- KEYS[1]  the bucket, "tq:{<rule>:<composite key>}", a hash:
--            b        "tokens:last_refill" (free tokens L, 6 decimals)
--            g:<h>    holder h's shares, "units,max,renew_by,expiry;...",
--                     the first its current one, the others replaced
--                     shares still held until their expiry
--            d:<h>    holder h's demand, "requests_per_second,expiry"
-- ARGV[1]  rate R, tokens per second (> 0)
-- ARGV[2]  burst B (> 0)
-- ARGV[3]  fill interval F, whole seconds: a share's rate is units / F
-- ARGV[4]  pool: the most units all shares may hold together
-- ARGV[5]  burst pool: the most max_tokens all shares may hold together
-- ARGV[6]  op: "share" or "release"
-- ARGV[7]  holder (one Envoy stream)
-- ARGV[8]  the holder's demand, requests per second
-- ARGV[9]  ttl: seconds the Envoy keeps the share (whole)
-- ARGV[10] grace: seconds a replaced or released share stays held
-- ARGV[11] optional: the time "<seconds>.<6 digits>" (tests); else TIME
--
-- Invariants: the units of live shares sum to at most the pool (<= R*F),
-- and L + (max_tokens of live shares) <= B. L refills at R minus the live
-- shares' rate, capped at B minus their max_tokens; a share leaves both at
-- its expiry. A new or changed share's max_tokens are taken from L before
-- it is granted (Envoy starts a new token bucket full); a renewal of the
-- same share only moves its expiry (Envoy keeps its bucket).
--
-- returns {units, max_tokens, changed (1/0), tokens}: units 0 is no share.

local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local fill = tonumber(ARGV[3])
local pool = tonumber(ARGV[4])
local bpool = tonumber(ARGV[5])
local op = ARGV[6]
local holder = ARGV[7]
local demand = tonumber(ARGV[8]) or 0
local ttl = tonumber(ARGV[9])
local grace = tonumber(ARGV[10])
local nowstr = ARGV[11]
if nowstr == nil or nowstr == '' then
  local t = redis.call('TIME')
  nowstr = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end
local now = tonumber(nowstr)
local function fmt(x) return string.format('%.6f', x) end

local raw = redis.call('HGETALL', KEYS[1])
local bval = nil
local shares, demands, stale = {}, {}, {}
for i = 1, #raw, 2 do
  local f, v = raw[i], raw[i + 1]
  local p = string.sub(f, 1, 2)
  if f == 'b' then
    bval = v
  elseif p == 'g:' then
    local list = {}
    for u, m, rb, e in string.gmatch(v, '(%d+),(%d+),([%d%.]+),([%d%.]+)') do
      list[#list + 1] = {tonumber(u), tonumber(m), tonumber(rb), tonumber(e)}
    end
    shares[string.sub(f, 3)] = list
  elseif p == 'd:' then
    local d, e = string.match(v, '^([%d%.]+),([%d%.]+)$')
    if d and tonumber(e) > now then
      demands[string.sub(f, 3)] = {tonumber(d), tonumber(e)}
    else
      stale[#stale + 1] = f
    end
  end
end

-- Refill piecewise between the expiries since the last call.
local last, tokens = now, nil
if bval then
  local a, b = string.match(bval, '^(%d+%.?%d*):(%d+%.?%d*)$')
  if a and b then tokens, last = tonumber(a), tonumber(b) end
end
if last > now then last = now end
local units, held, expiring = 0, 0, {}
for _, list in pairs(shares) do
  for _, s in ipairs(list) do
    if s[4] > last then
      units = units + s[1]
      held = held + s[2]
      if s[4] <= now then expiring[#expiring + 1] = s end
    end
  end
end
table.sort(expiring, function(x, y) return x[4] < y[4] end)
local function capped(x)
  local c = burst - held
  if c < 0 then c = 0 end
  if x > c then return c end
  return x
end
if tokens == nil then
  for _, s in ipairs(expiring) do units = units - s[1]; held = held - s[2] end
  tokens = capped(burst)
else
  tokens = capped(tokens)
  local t = last
  for _, s in ipairs(expiring) do
    local r = rate - units / fill
    if r < 0 then r = 0 end
    tokens = capped(tokens + (s[4] - t) * r)
    t = s[4]
    units = units - s[1]
    held = held - s[2]
  end
  local r = rate - units / fill
  if r < 0 then r = 0 end
  if now > t then tokens = capped(tokens + (now - t) * r) end
end
for h, list in pairs(shares) do
  local keep = {}
  for _, s in ipairs(list) do
    if s[4] > now then keep[#keep + 1] = s end
  end
  shares[h] = keep
end

local result = {0, 0, 0}
local mine = shares[holder] or {}
local cur = mine[1]
-- mine[1] is the current share only when it is live; a replaced share moves
-- to the back with its expiry cut to the grace.
local function retire()
  if cur ~= nil then
    local e = now + grace
    if cur[4] > e then cur[4] = e end
    cur[3] = 0
  end
end
if op == 'release' then
  retire()
  demands[holder] = nil
  redis.call('HDEL', KEYS[1], 'd:' .. holder)
else
  demands[holder] = {demand, now + ttl + grace}
  local total = 0
  for _, d in pairs(demands) do total = total + d[1] end
  local want, wantmax = 0, 1
  if total > 0 then
    want = math.floor(pool * demand / total)
    if demand > 0 and want < 1 then want = 1 end
    wantmax = math.floor(bpool * demand / total)
    if wantmax < 1 then wantmax = 1 end
  end
  -- Keep the current share while it is not above the target, less than
  -- a fifth (at least a unit) below it, and the Envoy still holds it
  -- (renew_by, less the grace for the answer's way to it, not passed):
  -- resending it only extends Envoy's assignment. A share above its
  -- target shrinks at once, for the others'.
  local slack = 1
  if cur ~= nil then slack = math.max(1, math.floor(cur[1] / 5)) end
  if cur ~= nil and cur[3] > now + grace and cur[1] <= want and want - cur[1] <= slack then
    cur[3] = now + ttl
    cur[4] = now + ttl + grace
    result = {cur[1], cur[2], 0}
  else
    retire()
    local free = pool
    for _, list in pairs(shares) do
      for _, s in ipairs(list) do free = free - s[1] end
    end
    local u = want
    if u > free then u = free end
    local m = wantmax
    if m > math.floor(tokens) then m = math.floor(tokens) end
    if u >= 1 and m >= 1 then
      tokens = tokens - m
      table.insert(mine, 1, {u, m, now + ttl, now + ttl + grace})
      result = {u, m, 1}
    end
  end
end
shares[holder] = mine

-- Floor the tokens to 6 decimals, and write.
if tokens < 0 then tokens = 0 end
local n = math.floor(tokens * 1e6)
local tokstr = fmt(n / 1e6)
result[4] = tokstr
for _, f in ipairs(stale) do redis.call('HDEL', KEYS[1], f) end
redis.call('HSET', KEYS[1], 'b', tokstr .. ':' .. fmt(now))
local maxexp = now
for h, list in pairs(shares) do
  if #list == 0 then
    redis.call('HDEL', KEYS[1], 'g:' .. h)
  else
    local parts = {}
    for _, s in ipairs(list) do
      parts[#parts + 1] = s[1] .. ',' .. s[2] .. ',' .. fmt(s[3]) .. ',' .. fmt(s[4])
      if s[4] > maxexp then maxexp = s[4] end
    end
    redis.call('HSET', KEYS[1], 'g:' .. h, table.concat(parts, ';'))
  end
end
for h, d in pairs(demands) do
  redis.call('HSET', KEYS[1], 'd:' .. h, fmt(d[1]) .. ',' .. fmt(d[2]))
  if d[2] > maxexp then maxexp = d[2] end
end
-- Until every share has expired and then L has refilled, plus a minute
-- (for a clock of the service's that differs from Redis's).
redis.call('PEXPIRE', KEYS[1], math.ceil(((maxexp - now) + burst / rate + 60) * 1000))
return result
