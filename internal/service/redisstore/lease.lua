-- tokengate-rls: one lease-mode bucket, updated atomically (docs/lease.md).
--
-- KEYS[1]  the bucket, "tl:{<rule>:<composite key>}", a hash:
--            b        "tokens:last_refill" (free tokens L, 6 decimals)
--            n        the last grant id handed out
--            h:<id>   one holder's live grants, "id,amount,expiry;..."
--            s:<id>   one active holder's share: free tokens kept for it
-- ARGV[1]  rate, tokens per second (> 0)
-- ARGV[2]  burst (> 0)
-- ARGV[3]  ttl of a grant, seconds
-- ARGV[4]  op: "take" (exact: ARGV[5] tokens, < 0 gives them back),
--          "lease" (holder ARGV[6] reports grant ARGV[7] with ARGV[8]
--          unspent and wants ARGV[5] more), "release" (holder ARGV[6]
--          returns ARGV[8] unspent of grant ARGV[7])
-- ARGV[9]  optional: the time "<seconds>.<6 digits>", for tests only;
--          otherwise Redis TIME (empty: Redis TIME)
-- ARGV[10] optional: the most one holder's share may reach (lease_max);
--          absent or 0: no shares, the free tokens go to whoever asks
--
-- Invariant: L + H <= burst, H the sum of the live grants' amounts. The
-- refill is capped at burst - H: room freed by a grant's expiry refills
-- from that expiry on, room freed by a report or a release from this call
-- on, never earlier (docs/lease.md, the accuracy bound).
--
-- take returns    {allowed (1/0), tokens}
-- lease returns   {code (1 OK, 2 OVER_LIMIT), granted, id, tokens, retry, valid_until, covered}
--                 (the new grant's amount is covered + granted)
-- release returns {1, returned, 0, tokens, "0", "0", 0}
-- Numbers that may be fractional are strings (Redis truncates Lua numbers).
--
-- Shares (fairness, issue 22): the refill is divided among the active
-- holders (those with a live grant, an empty one included, and the one
-- asking): each holder's share grows by refill / holders, up to ARGV[10],
-- and what would pass that goes to nobody in particular. Shares are free
-- tokens set aside, never more than L in all. A lease request is granted
-- from L less the other holders' shares (so its own share and the tokens
-- no share keeps), and its tokens come out of its share first; an exact
-- take (no holder) only from the tokens no share keeps. With equal demand
-- each holder gets rate / holders whoever asks first; a holder that asks
-- for less leaves the rest of the refill to the others once its share is
-- full. For a lease request, tokens (result[4]) are what that holder could
-- still be granted; for a take, what a take could still get.

local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local op = ARGV[4]
local amount = tonumber(ARGV[5]) or 0
local holder = ARGV[6] or ''
local grant = tonumber(ARGV[7]) or 0
local unspent = tonumber(ARGV[8]) or 0
if unspent < 0 then unspent = 0 end

local nowstr = ARGV[9]
if nowstr == nil or nowstr == '' then
  local t = redis.call('TIME')
  nowstr = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end
local now = tonumber(nowstr)

local function fmt(x) return string.format('%.6f', x) end

-- Read everything.
local raw = redis.call('HGETALL', KEYS[1])
local bval, lastid = nil, 0
local holders = {}   -- holder id -> list of {id, amount, expiry}
local order = {}
local shares = {}    -- holder id -> its share (free tokens kept for it)
local sharecap = tonumber(ARGV[10]) or 0
for i = 1, #raw, 2 do
  local f, v = raw[i], raw[i + 1]
  if f == 'b' then
    bval = v
  elseif f == 'n' then
    lastid = tonumber(v) or 0
  elseif string.sub(f, 1, 2) == 'h:' then
    local list = {}
    for id, amt, exp in string.gmatch(v, '(%d+),([%d%.]+),([%d%.]+)') do
      list[#list + 1] = {tonumber(id), tonumber(amt), tonumber(exp)}
    end
    holders[string.sub(f, 3)] = list
    order[#order + 1] = string.sub(f, 3)
  elseif string.sub(f, 1, 2) == 's:' then
    shares[string.sub(f, 3)] = tonumber(v) or 0
  end
end

local function held()
  local h = 0
  for _, list in pairs(holders) do
    for _, g in ipairs(list) do h = h + g[2] end
  end
  return h
end

-- Refill under the cap burst - H, H the live grants. A grant leaves H at
-- its expiry, its room refilling from then on at the rate (its tokens do
-- not come back to L: a dead proxy may have spent them); so the refill
-- since the last call runs piecewise between the expiries that fell in it.
-- Grants released or replaced by a report leave H only from this call on.
local stored = nil
if bval then
  local a, b = string.match(bval, '^(%d+%.?%d*):(%d+%.?%d*)$')
  local tk, ls = tonumber(a), tonumber(b)
  if tk ~= nil and ls ~= nil and ls > 0 then stored = {tk, ls} end
end
local last = now
if stored then last = stored[2] end
if now < last and last - now > 1.0 then last = now end
local h, expiring = 0, {}
for _, list in pairs(holders) do
  for _, g in ipairs(list) do
    if g[3] > now then
      h = h + g[2]
    elseif g[3] > last then
      h = h + g[2]
      expiring[#expiring + 1] = g
    end
  end
end
table.sort(expiring, function(x, y) return x[3] < y[3] end)
local function capped(x)
  local c = burst - h
  if c < 0 then c = 0 end
  if x > c then return c end
  return x
end
local tokens
local base = 0
if stored then
  tokens = capped(stored[1])
  base = tokens
  local t = last
  for _, g in ipairs(expiring) do
    tokens = capped(tokens + (g[3] - t) * rate)
    t = g[3]
    h = h - g[2]
  end
  if now > t then tokens = capped(tokens + (now - t) * rate) end
else
  for _, g in ipairs(expiring) do h = h - g[2] end
  tokens = capped(burst)
  base = tokens
end
local refilled = tokens - base
if refilled < 0 then refilled = 0 end
if now > last then last = now end

-- Expired grants leave the record.
for hd, list in pairs(holders) do
  local keep = {}
  for _, g in ipairs(list) do
    if g[3] > now then keep[#keep + 1] = g end
  end
  holders[hd] = keep
end

-- Shares: the active holders split the refill since the last call; a
-- holder no longer active (no live grant) keeps nothing; the shares never
-- exceed L.
local dropped = {}
local shared, nactive, mineleft = 0, 1, 0
if sharecap > 0 then
  local active, nact = {}, 0
  for hd, list in pairs(holders) do
    if #list > 0 then active[hd] = true; nact = nact + 1 end
  end
  if op == 'lease' and holder ~= '' and not active[holder] then
    active[holder] = true; nact = nact + 1
  end
  for hd, _ in pairs(shares) do
    if not active[hd] then shares[hd] = nil; dropped[#dropped + 1] = hd end
  end
  for hd, _ in pairs(active) do
    local e = (shares[hd] or 0) + refilled / nact
    if e > sharecap then e = sharecap end
    shares[hd] = e
  end
  for _, e in pairs(shares) do shared = shared + e end
  if shared > tokens then
    local f = 0
    if shared > 0 then f = tokens / shared end
    for hd, e in pairs(shares) do shares[hd] = e * f end
    shared = tokens
  end
  if nact > 0 then nactive = nact end
end

local result
local changed = {}
if op == 'take' then
  local allowed = 1
  if amount < 0 then
    tokens = tokens - amount
    local c = burst - held()
    if tokens > c then tokens = c end
  elseif tokens - shared >= amount then
    tokens = tokens - amount
  else
    allowed = 0
  end
  result = {allowed}
else
  -- The holder's report: grants older than the reported one were carried
  -- into it; the reported one is covered by what follows (or returned).
  -- Only what grant k still holds can be covered: a report naming a grant
  -- that is gone (expired, or replaced by an answer the proxy never
  -- applied) covers nothing, and the answer says so (covered), so that the
  -- proxy stops counting those tokens.
  local list = holders[holder] or {}
  local keep, covered = {}, 0
  for _, g in ipairs(list) do
    if g[1] == grant then
      covered = math.min(unspent, g[2])
    elseif g[1] > grant then
      keep[#keep + 1] = g
    end
  end
  changed[holder] = true
  if op == 'release' then
    holders[holder] = keep
    tokens = tokens + covered
    local c = burst - held()
    if tokens > c then tokens = c end
    result = {1, math.floor(covered), 0, nil, '0', '0', 0}
  else
    -- A renewal carries whole tokens: the answer's Quota.requests is an
    -- integer.
    covered = math.floor(covered)
    local want = math.floor(amount)
    if want < 0 then want = 0 end
    -- What this holder may take: L less the other holders' shares.
    local mine = shares[holder] or 0
    local avail = tokens - (shared - mine)
    if avail < 0 then avail = 0 end
    local g = math.floor(avail + 1e-9)
    if g > want then g = want end
    if g < 0 then g = 0 end
    tokens = tokens - g
    if sharecap > 0 then
      mine = mine - g
      if mine < 0 then mine = 0 end
      shared = shared - (shares[holder] or 0) + mine
      shares[holder] = mine
    end
    mineleft = avail - g
    lastid = lastid + 1
    local exp = now + ttl
    keep[#keep + 1] = {lastid, covered + g, exp}
    holders[holder] = keep
    local code, retry = 1, 0
    if want > 0 and g == 0 then
      -- Until this holder may take a token: its share grows at least at
      -- rate / holders.
      code = 2
      retry = (1 - avail) / rate
      if sharecap > 0 then retry = retry * nactive end
      if retry < 0 then retry = 0 end
    end
    result = {code, g, lastid, nil, fmt(retry), fmt(exp), covered}
  end
end

-- Floor tokens to 6 decimals (sharedstate's codec).
if tokens < 0 then tokens = 0 end
local n = math.floor(tokens * 1e6)
if (n + 1) / 1e6 <= tokens then n = n + 1 elseif n > 0 and n / 1e6 > tokens then n = n - 1 end
local tokstr = fmt(n / 1e6)
local function floor6(x)
  if x < 0 then x = 0 end
  return fmt(math.floor(x * 1e6 + 1e-6) / 1e6)
end
if op == 'take' then
  result[2] = tokstr
  if sharecap > 0 then result[2] = floor6(n / 1e6 - shared) end
elseif op == 'lease' then
  result[4] = tokstr
  if sharecap > 0 then result[4] = floor6(mineleft) end
else
  result[4] = tokstr
end

-- Write: state, id counter, changed holders; TTL: until every grant has
-- expired and then the bucket has refilled to full, plus 1 s. (The room a
-- grant holds only starts to refill when it expires: a key that vanished
-- earlier would come back full and admit the grants' tokens twice.)
if op ~= 'take' or result[1] == 1 then
  redis.call('HSET', KEYS[1], 'b', tokstr .. ':' .. fmt(last), 'n', tostring(lastid))
  local maxexp = now
  for h, list in pairs(holders) do
    local parts = {}
    for _, g in ipairs(list) do
      parts[#parts + 1] = tostring(g[1]) .. ',' .. fmt(g[2]) .. ',' .. fmt(g[3])
      if g[3] > maxexp then maxexp = g[3] end
    end
    if #parts == 0 then
      redis.call('HDEL', KEYS[1], 'h:' .. h)
    else
      redis.call('HSET', KEYS[1], 'h:' .. h, table.concat(parts, ';'))
    end
  end
  for hd, e in pairs(shares) do
    redis.call('HSET', KEYS[1], 's:' .. hd, fmt(e))
  end
  for _, hd in ipairs(dropped) do
    redis.call('HDEL', KEYS[1], 's:' .. hd)
  end
  local full = (burst - n / 1e6) / rate
  local ttlms = math.ceil((full + (maxexp - now) + 1) * 1000)
  redis.call('PEXPIRE', KEYS[1], ttlms)
end
return result
