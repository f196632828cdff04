-- tokengate-rls: one RLQS bucket split among Envoy processes as shares of
-- its rate and burst (docs/rlqs.md), updated atomically for every holder
-- that reported it since the last call (one call per bucket per batch).
--
-- KEYS[1]  the bucket, "tq:{<rule>:<composite key>}", a hash:
--            b        "tokens:last_refill" (free tokens L, 6 decimals)
--            g:<h>    holder h's shares, "units,max,renew_by,expiry,fill,granted;...",
--                     the first its current one (renew_by > 0), the others
--                     retired shares still held until their expiry
--            d:<h>    holder h's demand, "requests_per_second,expiry,waiting_since"
--                     (waiting_since 0: not waiting for a share)
-- ARGV[1]  rate R, tokens per second (> 0)
-- ARGV[2]  burst B (> 0)
-- ARGV[3]  fill interval F, whole seconds: a share's rate is units / F
-- ARGV[4]  pool: the most units (of F) all shares may hold together
-- ARGV[5]  burst pool: the max_tokens shared out, in proportion to units
-- ARGV[6]  grace: seconds a replaced or released share stays held
-- ARGV[7]  turn: seconds a share is held before it yields to a waiting holder
-- ARGV[8]  the time "<seconds>.<6 digits>" (tests), or "" for TIME
-- ARGV[9..] one group of 4 per holder: op ("share"/"release"), holder,
--          demand (requests per second), ttl (whole seconds)
--
-- Invariants: the live shares' rates (units/fill each) sum to at most
-- pool/F, and L + (max_tokens of live shares) <= B. L refills at R minus
-- the live shares' rates, capped at B minus their max_tokens; a share
-- leaves both at its expiry. A new or changed share's max_tokens are taken
-- from L before it is granted (Envoy starts a new token bucket full); a
-- renewal of the same share only moves its expiry (Envoy keeps its bucket).
-- A holder's replaced share keeps, until its expiry, only the rate by
-- which it exceeds the new one: the Envoy runs one bucket at a time.
--
-- returns {units, max_tokens, changed (1/0)} per holder, then the free tokens.

local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local fill = tonumber(ARGV[3])
local pool = tonumber(ARGV[4])
local bpool = tonumber(ARGV[5])
local grace = tonumber(ARGV[6])
local turn = tonumber(ARGV[7])
local nowstr = ARGV[8]
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
    for u, m, rb, e, fi, gr in string.gmatch(v, '([%d%.]+),(%d+),([%d%.]+),([%d%.]+),(%d+),([%d%.]+)') do
      list[#list + 1] = {tonumber(u), tonumber(m), tonumber(rb), tonumber(e), tonumber(fi), tonumber(gr)}
    end
    shares[string.sub(f, 3)] = list
  elseif p == 'd:' then
    local d, e, w = string.match(v, '^([%d%.]+),([%d%.]+),([%d%.]+)$')
    if d and tonumber(e) > now then
      demands[string.sub(f, 3)] = {tonumber(d), tonumber(e), tonumber(w)}
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
local srate, held, expiring = 0, 0, {}
for _, list in pairs(shares) do
  for _, s in ipairs(list) do
    if s[4] > last then
      srate = srate + s[1] / s[5]
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
  for _, s in ipairs(expiring) do srate = srate - s[1] / s[5]; held = held - s[2] end
  tokens = capped(burst)
else
  tokens = capped(tokens)
  local t = last
  for _, s in ipairs(expiring) do
    local r = rate - srate
    if r < 0 then r = 0 end
    tokens = capped(tokens + (s[4] - t) * r)
    t = s[4]
    srate = srate - s[1] / s[5]
    held = held - s[2]
  end
  local r = rate - srate
  if r < 0 then r = 0 end
  if now > t then tokens = capped(tokens + (now - t) * r) end
end
-- Only what changed is written back: the batch's holders and the holders
-- whose shares expired (a call costs O(holders) to read, O(batch) to write).
local dirty = {}
for h, list in pairs(shares) do
  local keep = {}
  for _, s in ipairs(list) do
    if s[4] > now then keep[#keep + 1] = s end
  end
  if #keep ~= #list then dirty[h] = true end
  shares[h] = keep
end
local function current(h)
  local list = shares[h]
  if list and list[1] and list[1][3] > 0 then return list[1] end
  return nil
end

-- The batch: demands first, so that every holder's target sees them all.
local ops = {}
for i = 9, #ARGV - 3, 4 do
  local o = {op = ARGV[i], holder = ARGV[i + 1], demand = tonumber(ARGV[i + 2]) or 0, ttl = tonumber(ARGV[i + 3])}
  ops[#ops + 1] = o
  dirty[o.holder] = true
  if o.op == 'release' then
    demands[o.holder] = nil
    redis.call('HDEL', KEYS[1], 'd:' .. o.holder)
  else
    local w = 0
    if demands[o.holder] then w = demands[o.holder][3] end
    demands[o.holder] = {o.demand, now + o.ttl + grace, w}
  end
end

-- Targets, in units of F: max-min fair (water filling) among the holders
-- that hold a share or ask for one now, each wanting one and a half times
-- its demand, at least one unit; what the wants leave is spread evenly.
-- Holders waiting (demand, no share) count as far as the free tokens
-- could start shares for them, oldest first.
local active, waiters = {}, {}
for h, d in pairs(demands) do
  if current(h) ~= nil then
    active[h] = d[1]
  elseif d[1] > 0 then
    waiters[#waiters + 1] = {h, d[3]}
  end
end
table.sort(waiters, function(x, y) return x[2] < y[2] end)
for i = 1, math.min(#waiters, math.floor(tokens)) do
  active[waiters[i][1]] = demands[waiters[i][1]][1]
end
for _, o in ipairs(ops) do
  if o.op ~= 'release' then active[o.holder] = o.demand end
end
local wants = {}
for h, d in pairs(active) do
  local w = math.ceil(d * fill * 1.5)
  if w < 1 then w = 1 end
  wants[#wants + 1] = {h, w}
end
table.sort(wants, function(x, y) return x[2] < y[2] end)
local target = {}
local left, n = pool, #wants
for i, hw in ipairs(wants) do
  local fair = left / (n - i + 1)
  local give = hw[2]
  if give > fair then give = fair end
  target[hw[1]] = give
  left = left - give
end
local holding = 0
for h in pairs(target) do
  if current(h) ~= nil then holding = holding + 1 end
end
if left > 0 and holding > 0 then
  for h, v in pairs(target) do
    if current(h) ~= nil then target[h] = v + left / holding end
  end
end
local function rateOf(list)
  local r = 0
  for _, s in ipairs(list) do r = r + s[1] / s[5] end
  return r
end
local othersRate = 0
for _, list in pairs(shares) do othersRate = othersRate + rateOf(list) end
-- Holders waiting for a share, oldest first: rank[h] is how many waited
-- longer (computed once: the batch is linear in its holders).
local rank = {}
for i, w in ipairs(waiters) do rank[w[1]] = i - 1 end
local function waitersBefore(h, since)
  if since == 0 or rank[h] == nil then
    if rank[h] ~= nil then return #waiters - 1 end
    return #waiters
  end
  return rank[h]
end

local result = {}
for _, o in ipairs(ops) do
  local h = o.holder
  local mine = shares[h] or {}
  local cur = current(h)
  local res = {0, 0, 0}
  -- retire cur, keeping until its expiry (at most the grace) only the
  -- rate above the holder's new one.
  local function retire(newrate)
    if cur ~= nil then
      local e = now + grace
      if cur[4] > e then cur[4] = e end
      cur[3] = 0
      local keep = cur[1] / cur[5] - newrate
      if keep < 0 then keep = 0 end
      othersRate = othersRate - cur[1] / cur[5] + keep
      cur[1] = keep * cur[5]
    end
  end
  if o.op == 'release' then
    retire(0)
    res = {0, 0, 1}
  else
    local d = demands[h]
    local want = math.floor(target[h] or 1)
    if want < 1 then want = 1 end
    local wantmax = math.floor(bpool * want / pool)
    if wantmax < 1 then wantmax = 1 end
    local slack = 1
    if cur ~= nil then slack = math.max(1, math.floor(cur[1] / 5)) end
    local waiting = waitersBefore(h, 0)
    if cur ~= nil and waiting > 0 and tokens < 1 and now - cur[6] >= turn then
      -- Its turn is over and others wait with no room: yield.
      retire(0)
      d[3] = now
      res = {0, 0, 1}
    elseif cur ~= nil and cur[5] == fill and cur[3] > now + grace and cur[1] <= want and want - cur[1] <= slack and othersRate <= pool / fill + 1e-9
      and (2 * cur[2] >= wantmax or math.floor(tokens) < wantmax) then
      -- Renewal: the same share, a later expiry (unless its max_tokens
      -- are less than half its target and the free tokens can pay more).
      cur[3] = now + o.ttl
      cur[4] = now + o.ttl + grace
      res = {cur[1], cur[2], 0}
      d[3] = 0
    else
      local curRate = 0
      if cur ~= nil then curRate = cur[1] / cur[5] end
      local avail = math.floor((pool / fill - (othersRate - curRate)) * fill + 1e-6)
      local u = want
      if u > avail then u = avail end
      local m = wantmax
      if m > math.floor(tokens) then m = math.floor(tokens) end
      -- A holder growing its share leaves a token for the oldest waiting
      -- Envoy (a shrinking one frees rate for it); waiting ones take
      -- their turn oldest first.
      local mayTake
      if cur ~= nil then
        mayTake = waiting == 0 or u < cur[1] or math.floor(tokens - m) >= 1
      else
        mayTake = waitersBefore(h, d[3]) < math.floor(tokens)
      end
      if u >= 1 and m >= 1 and mayTake then
        retire(u / fill)
        tokens = tokens - m
        othersRate = othersRate + u / fill
        table.insert(mine, 1, {u, m, now + o.ttl, now + o.ttl + grace, fill, now})
        res = {u, m, 1}
        d[3] = 0
      elseif cur ~= nil and cur[5] == fill and cur[3] > now + grace and othersRate <= pool / fill + 1e-9 then
        -- No room to change it now: keep it rather than collapse (unless
        -- the live shares exceed the pool: the rule was lowered).
        cur[3] = now + o.ttl
        cur[4] = now + o.ttl + grace
        res = {math.floor(cur[1]), cur[2], 0}
      else
        retire(0)
        if d[3] == 0 then d[3] = now end
        res = {0, 0, 1}
      end
    end
  end
  shares[h] = mine
  result[#result + 1] = res[1]
  result[#result + 1] = res[2]
  result[#result + 1] = res[3]
end

-- Floor the tokens to 6 decimals, and write.
if tokens < 0 then tokens = 0 end
local tokstr = fmt(math.floor(tokens * 1e6) / 1e6)
result[#result + 1] = tokstr
local del, set = {}, {'b', tokstr .. ':' .. fmt(now)}
for _, f in ipairs(stale) do del[#del + 1] = f end
local maxexp = now
for h, list in pairs(shares) do
  for _, s in ipairs(list) do
    if s[4] > maxexp then maxexp = s[4] end
  end
  if dirty[h] then
    if #list == 0 then
      del[#del + 1] = 'g:' .. h
    else
      local parts = {}
      for _, s in ipairs(list) do
        parts[#parts + 1] = fmt(s[1]) .. ',' .. s[2] .. ',' .. fmt(s[3]) .. ',' .. fmt(s[4]) .. ',' .. s[5] .. ',' .. fmt(s[6])
      end
      set[#set + 1] = 'g:' .. h
      set[#set + 1] = table.concat(parts, ';')
    end
  end
end
for h, d in pairs(demands) do
  if d[2] > maxexp then maxexp = d[2] end
  if dirty[h] then
    set[#set + 1] = 'd:' .. h
    set[#set + 1] = fmt(d[1]) .. ',' .. fmt(d[2]) .. ',' .. fmt(d[3])
  end
end
local function each(cmd, args, step)
  for i = 1, #args, step do
    redis.call(cmd, KEYS[1], unpack(args, i, math.min(i + step - 1, #args)))
  end
end
each('HDEL', del, 500)
each('HSET', set, 500)
-- Until every share has expired and then L has refilled, plus a minute
-- (for a clock of the service's that differs from Redis's).
redis.call('PEXPIRE', KEYS[1], math.ceil(((maxexp - now) + burst / rate + 60) * 1000))
return result
