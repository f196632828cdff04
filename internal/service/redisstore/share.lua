-- tokengate-rls: one RLQS bucket split among Envoy processes as shares of
-- its rate and burst (docs/rlqs.md), updated atomically for every holder
-- that reported it since the last call (one call per bucket per batch).
--
-- A call costs O(holders in the batch + holders whose shares expired since
-- the last call), never O(holders of the bucket): the bucket keeps running
-- totals of its shares and demands, and an index of expiries, so that no
-- call reads every holder (2,000 Envoys on one bucket made each call read
-- 2,000 records, 12-14 ms of Redis time).
--
-- KEYS[1]  the bucket, "tq:{<rule>:<composite key>}", a hash:
--            b        "tokens:last_refill" (free tokens L, 6 decimals)
--            t        the running totals, "srate,held,entries,holders,
--                     waiters,waitwant,next_ticket,head_ticket,done_slot,
--                     max_slot": the live share entries' rates (tokens/s)
--                     and max_tokens summed, their count, the holders with
--                     a current share, the holders waiting for one and
--                     their wants summed, the waiting queue's tickets, the
--                     last expiry slot processed and the latest written
--            w        the current holders' wants (units of F), a histogram
--                     "bin:count:sum,..." (exact to 32, then 5 % bins)
--            g:<h>    holder h's shares, "units,max,renew_by,expiry,fill,granted;...",
--                     the first its current one (renew_by > 0), the others
--                     retired shares still held until their expiry
--            d:<h>    holder h's demand, "requests_per_second,expiry,ticket,want"
--                     (ticket > 0: waiting for a share; want: the units
--                     counted for h in w, or in waitwant while waiting)
--            q:<n>    the holder waiting with ticket n
--            x:<k>    the number of parts x:<k>:<i> listing (space-separated)
--                     holders with an entry or a demand expiring at slot k
--                     (k tenths of a second; expiries are rounded up to
--                     one); a call adds a part instead of rewriting a list
-- ARGV[1]  rate R, tokens per second (> 0)
-- ARGV[2]  burst B (> 0)
-- ARGV[3]  fill interval F, whole seconds: a share's rate is units / F
-- ARGV[4]  pool: the most units (of F) all shares may hold together
-- ARGV[5]  burst pool: the max_tokens shared out, in proportion to units;
--          also the most shares held at once (each holds at least one)
-- ARGV[6]  grace: seconds a replaced or released share stays held
-- ARGV[7]  turn: seconds a share is held before it yields to a waiting holder
--          (longer for a share below its target, in proportion)
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
-- The totals equal the sums over the g: and d: records: every change of a
-- record changes them in the same call, and every expiry is listed in x:
-- at its slot, which the next call after it processes (in order, refilling
-- L piecewise between them). A bucket without totals (written by an older
-- version) is rebuilt from its records once.
--
-- returns {units, max_tokens, changed (1/0)} per holder, then the free tokens.

local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local fill = tonumber(ARGV[3])
local pool = tonumber(ARGV[4])
local bpool = tonumber(ARGV[5])
local grace = tonumber(ARGV[6])
local turn = tonumber(ARGV[7])
local nowstr = ARGV[8]
-- A one-token share covers its holder's demand with this margin (its
-- bucket drops any refill above the demand); a share whose turn is over
-- waits for the free tokens that start the next one at most this many
-- turns.
local cover_margin = 1.01
local turn_wait = 1.25
if nowstr == nil or nowstr == '' then
  local t = redis.call('TIME')
  nowstr = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end
local now = tonumber(nowstr)
local function fmt(x) return string.format('%.6f', x) end
local cap = math.max(1, math.floor(bpool))

-- Slots: an expiry e is rounded up to the next tenth of a second (held a
-- little longer, never shorter), computed on whole microseconds.
local function slotUp(e) return math.floor((math.floor(e * 1e6 + 0.5) + 99999) / 100000) end
local nowslot = math.floor(math.floor(now * 1e6 + 0.5) / 100000)

local function hmget(fields)
  local out = {}
  for i = 1, #fields, 1000 do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + 999, #fields)))
    for _, v in ipairs(part) do out[#out + 1] = v end
  end
  return out
end

-- The batch, and one read of all a call usually needs: the totals, the
-- batch's records and the expiry slots its shares will be listed at.
local ops = {}
for i = 9, #ARGV - 3, 4 do
  ops[#ops + 1] = {op = ARGV[i], holder = ARGV[i + 1], demand = tonumber(ARGV[i + 2]) or 0, ttl = tonumber(ARGV[i + 3])}
end
local first, firstAt = {'b', 't', 'w'}, {}
for _, o in ipairs(ops) do
  if not firstAt[o.holder] then
    firstAt[o.holder] = #first + 1
    first[#first + 1] = 'g:' .. o.holder
    first[#first + 1] = 'd:' .. o.holder
  end
end
local xcount, xAt = {}, {}
local function candidate(e)
  local k = slotUp(e)
  if not xAt[k] then
    xAt[k] = #first + 1
    first[#first + 1] = 'x:' .. k
  end
end
candidate(now + grace)
for _, o in ipairs(ops) do candidate(now + (o.ttl or 0) + grace) end
local head = hmget(first)
local bval, tval, wval = head[1], head[2], head[3]
for k, i in pairs(xAt) do xcount[k] = tonumber(head[i]) or 0 end

-- Totals.
local T = {srate = 0, held = 0, ne = 0, nh = 0, nw = 0, sw = 0, tq = 1, hq = 1, ps = nowslot, ms = nowslot}
local hist = {}
local function binOf(w)
  if w <= 32 then return w end
  return 32 + math.floor(math.log(w / 32) / math.log(1.05))
end
local function histAdd(w, sign)
  if w < 1 then return end
  local b = binOf(w)
  local e = hist[b] or {0, 0}
  e[1] = e[1] + sign
  e[2] = e[2] + sign * w
  if e[1] <= 0 then hist[b] = nil else hist[b] = e end
end

-- Records, loaded on demand: R[h] = {list = shares, d = demand or nil}.
local R, dirty = {}, {}
local function parseList(v)
  local list = {}
  if v then
    for u, m, rb, e, fi, gr in string.gmatch(v, '([%d%.]+),(%d+),([%d%.]+),([%d%.]+),(%d+),([%d%.]+)') do
      list[#list + 1] = {tonumber(u), tonumber(m), tonumber(rb), tonumber(e), tonumber(fi), tonumber(gr)}
    end
  end
  return list
end
local function parseDemand(v)
  if not v then return nil end
  local d, e, tk, w = string.match(v, '^([%d%.]+),([%d%.]+),(%d+),(%d+)$')
  if not d then return nil end
  return {tonumber(d), tonumber(e), tonumber(tk), tonumber(w)}
end
local function load(hs)
  local want, fields = {}, {}
  for _, h in ipairs(hs) do
    if R[h] == nil and not want[h] then
      want[h] = true
      fields[#fields + 1] = 'g:' .. h
      fields[#fields + 1] = 'd:' .. h
    end
  end
  if #fields == 0 then return end
  local vals = hmget(fields)
  for i = 1, #fields, 2 do
    R[string.sub(fields[i], 3)] = {list = parseList(vals[i]), d = parseDemand(vals[i + 1])}
  end
end
for h, i in pairs(firstAt) do
  R[h] = {list = parseList(head[i]), d = parseDemand(head[i + 1])}
end
local function current(rec)
  local s = rec.list[1]
  if s and s[3] > 0 then return s end
  return nil
end

-- Slot lists to append to, queue tickets to write or delete, fields to delete.
local appendTo = {}
local function listAt(h, e)
  local k = slotUp(e)
  -- (a slot already processed, after a clock that went back: the next one)
  if k <= T.ps then k = T.ps + 1 end
  if k > T.ms then T.ms = k end
  local l = appendTo[k]
  if not l then l = {seen = {}}; appendTo[k] = l end
  if l.seen[h] then return end
  l.seen[h] = true
  l[#l + 1] = h
end
local qset, qdel, del = {}, {}, {}

if tval then
  local v = {}
  for x in string.gmatch(tval, '[^,]+') do v[#v + 1] = tonumber(x) end
  T = {srate = v[1], held = v[2], ne = v[3], nh = v[4], nw = v[5], sw = v[6], tq = v[7], hq = v[8], ps = v[9], ms = v[10]}
  if wval then
    for b, c, s in string.gmatch(wval, '(%d+):(%d+):(%d+)') do hist[tonumber(b)] = {tonumber(c), tonumber(s)} end
  end
elseif bval then
  -- State without totals (an older version's): rebuild them, once, from
  -- the records (the only call that reads every holder).
  local raw = redis.call('HGETALL', key)
  for i = 1, #raw, 2 do
    local f, v = raw[i], raw[i + 1]
    local p, h = string.sub(f, 1, 2), string.sub(f, 3)
    if p == 'g:' or p == 'd:' then
      R[h] = R[h] or {list = {}, d = nil}
      if p == 'g:' then
        R[h].list = parseList(v)
      else
        local d, e = string.match(v, '^([%d%.]+),([%d%.]+)')
        R[h].d = d and {tonumber(d), tonumber(e), 0, 0} or nil
      end
      dirty[h] = true
    end
  end
  for h, rec in pairs(R) do
    local live = {}
    for _, s in ipairs(rec.list) do
      if s[4] > now then live[#live + 1] = s end
    end
    rec.list = live
    local cur = current(rec)
    if rec.d and rec.d[2] <= now then rec.d = nil end
    for _, s in ipairs(rec.list) do
      s[4] = slotUp(s[4]) / 10
      T.srate = T.srate + s[1] / s[5]
      T.held = T.held + s[2]
      T.ne = T.ne + 1
      listAt(h, s[4])
    end
    if rec.d then
      rec.d[2] = slotUp(rec.d[2]) / 10
      listAt(h, rec.d[2])
      if cur then
        rec.d[4] = math.max(1, math.ceil(rec.d[1] * fill * 1.5))
        T.nh = T.nh + 1
        histAdd(rec.d[4], 1)
      end
    elseif cur then
      -- A share without a demand record: counted as wanting its units.
      rec.d = {0, cur[4], 0, math.max(1, math.floor(cur[1]))}
      T.nh = T.nh + 1
      histAdd(rec.d[4], 1)
      listAt(h, cur[4])
    end
  end
end

-- Free tokens, refilled piecewise through the expiry slots since the last
-- call: each expiry takes its entry's rate and max_tokens out of the totals.
local last, tokens = now, nil
if bval then
  local a, b = string.match(bval, '^(%d+%.?%d*):(%d+%.?%d*)$')
  if a and b then tokens, last = tonumber(a), tonumber(b) end
end
if last > now or (bval and not tval) then last = now end
local function capped(x)
  local c = burst - T.held
  if c < 0 then c = 0 end
  if x > c then return c end
  return x
end
local tt = last
local function refillTo(t)
  if tokens ~= nil and t > tt then
    local r = rate - T.srate
    if r < 0 then r = 0 end
    tokens = capped(tokens + (t - tt) * r)
  end
  if t > tt then tt = t end
end
if tokens ~= nil then tokens = capped(tokens) end

local function dequeue(d)
  if d[3] > 0 then
    T.nw = T.nw - 1
    T.sw = T.sw - d[4]
    if qset[d[3]] and d[3] == T.tq - 1 then
      -- the last ticket, given in this call: not given after all
      T.tq = T.tq - 1
      if T.hq > T.tq then T.hq = T.tq end
    else
      qdel[d[3]] = true
    end
    qset[d[3]] = nil
    d[3] = 0
  end
end
local function enqueue(h, d)
  d[3] = T.tq
  T.tq = T.tq + 1
  qset[d[3]] = h
  T.nw = T.nw + 1
  T.sw = T.sw + d[4]
end
local function hold(d, w)
  T.nh = T.nh + 1
  d[4] = w
  histAdd(w, 1)
end
local function unhold(d)
  T.nh = T.nh - 1
  histAdd(d[4], -1)
end

local from, to = T.ps + 1, math.min(nowslot, T.ms)
if to >= from then
  local fields = {}
  for k = from, to do fields[#fields + 1] = 'x:' .. k end
  local counts = hmget(fields)
  local parts, at = {}, {}
  for i, v in ipairs(counts) do
    if v then
      local k = from + i - 1
      del[#del + 1] = fields[i]
      for j = 1, tonumber(v) do
        parts[#parts + 1] = fields[i] .. ':' .. j
        at[#at + 1] = k
        del[#del + 1] = parts[#parts]
      end
    end
  end
  local vals = hmget(parts)
  local lists, hs, byk = {}, {}, {}
  for i, v in ipairs(vals) do
    if v then
      local l = byk[at[i]]
      if not l then
        l = {}
        byk[at[i]] = l
        lists[#lists + 1] = {at[i], l}
      end
      for h in string.gmatch(v, '%S+') do l[#l + 1] = h; hs[#hs + 1] = h end
    end
  end
  load(hs)
  for _, kl in ipairs(lists) do
    local tk = kl[1] / 10
    refillTo(tk)
    for _, h in ipairs(kl[2]) do
      local rec = R[h]
      local cur = current(rec)
      local keep, changed = {}, false
      for _, s in ipairs(rec.list) do
        if s[4] <= tk + 1e-7 then
          T.srate = T.srate - s[1] / s[5]
          T.held = T.held - s[2]
          T.ne = T.ne - 1
          changed = true
          if s == cur and rec.d then unhold(rec.d) end
        else
          keep[#keep + 1] = s
        end
      end
      if changed then rec.list = keep; dirty[h] = true end
      if rec.d and rec.d[2] <= tk + 1e-7 then
        local c = current(rec)
        if c ~= nil then
          -- (not written so: a demand outlives its holder's share)
          rec.d[2] = c[4]
          listAt(h, c[4])
        else
          dequeue(rec.d)
          rec.d = nil
        end
        dirty[h] = true
      end
    end
    if T.ne <= 0 then T.srate, T.held, T.ne = 0, 0, 0 end
  end
end
if nowslot > T.ps then T.ps = nowslot end
if tokens == nil then
  tokens = capped(burst)
else
  refillTo(now)
end

-- The batch: demands first, so that every holder's target sees them all.
for _, o in ipairs(ops) do
  local h = o.holder
  local rec = R[h]
  dirty[h] = true
  if o.op ~= 'release' then
    local want = math.ceil(o.demand * fill * 1.5)
    if want < 1 then want = 1 end
    local d = rec.d
    if d == nil then
      d = {0, 0, 0, 0}
      rec.d = d
      if current(rec) ~= nil then hold(d, want) end
    end
    if current(rec) ~= nil then
      if d[4] ~= want then
        histAdd(d[4], -1)
        histAdd(want, 1)
      end
      d[4] = want
    elseif d[3] > 0 then
      T.sw = T.sw + want - d[4]
      d[4] = want
    elseif o.demand > 0 then
      d[4] = want
      enqueue(h, d)
    else
      d[4] = want
    end
    d[1] = o.demand
    d[2] = slotUp(now + o.ttl + grace) / 10
    listAt(h, d[2])
    o.want = want
  end
end

-- Advance the queue's head past the tickets no longer waiting (each is
-- passed once); rank = tickets before one's own (at least the waiting ones).
local function qlive(n, stored)
  if qset[n] then return true end
  if qdel[n] then return false end
  return stored
end
while T.hq < T.tq do
  local l = qlive(T.hq, nil)
  if l == true then break end
  if l == false then
    T.hq = T.hq + 1
  else
    local start = T.hq
    local fields = {}
    for n = start, math.min(start + 63, T.tq - 1) do fields[#fields + 1] = 'q:' .. n end
    local vals = hmget(fields)
    local live = false
    for i = 1, #fields do
      if qlive(start + i - 1, vals[i] and true or false) then live = true; break end
      T.hq = start + i
    end
    if live then break end
  end
end

-- Targets, in units of F: max-min fair (water filling, on the histogram)
-- among the holders with a share and as many waiting ones as there are
-- free places (cap: each share needs a token of max_tokens), each wanting
-- one and a half times its demand, at least one unit; what the wants leave
-- is spread evenly among the holders.
local items = {}
for _, e in pairs(hist) do items[#items + 1] = {e[1], e[2]} end
local cw = 0
if T.nw > 0 then
  cw = math.min(T.nw, math.max(0, cap - T.nh))
  if cw > 0 then items[#items + 1] = {cw, cw * T.sw / T.nw} end
end
table.sort(items, function(x, y) return x[2] / x[1] < y[2] / y[1] end)
local left, n, level = pool, T.nh + cw, nil
for _, it in ipairs(items) do
  if n <= 0 then break end
  local fair = left / n
  if it[2] / it[1] <= fair then
    left = left - it[2]
    n = n - it[1]
  else
    level = fair
    break
  end
end
local spread = 0
if level == nil and left > 0 and T.nh > 0 then spread = left / T.nh end
-- (crowded: more Envoys hold or wait than there are places)
local crowded = T.nh + T.nw > cap
local function targetOf(h, want, holding)
  -- A share of one token (its part of the burst pool is under two)
  -- admits at most its holder's demand, so it gets what covers the
  -- demand (+1 %) and no more, when the pool or the places run short;
  -- so does a first share of one token when the pool cannot cover as
  -- many such demands as there are places (else it gets its want).
  local cover = math.min(want, math.ceil(want / 1.5 * cover_margin))
  if (level ~= nil or crowded) and bpool * cover / pool < 2 then return cover end
  if not holding and bpool * want / pool < 2 and pool < cover * cap then return cover end
  if level ~= nil then
    -- A share of max_tokens 1 below its holder's demand is worth little
    -- to it (a bucket of one token refilled slower than the requests
    -- come admits one in two): when the pool cannot cover every demand
    -- and the burst gives each share a single token, a share covers its
    -- holder's demand if the pool has it (the next ones get what is
    -- left, or wait their turn).
    local floor = math.min(want, math.ceil(want / 1.5 * 1.05))
    if level < floor and bpool * level / pool < 2 then return floor end
    return math.min(want, level)
  end
  if holding then return want + spread end
  return want
end

local function cur_units(cur)
  if cur == nil or cur[1] <= 0 then return 1 end
  return cur[1]
end

local result = {}
for _, o in ipairs(ops) do
  local h = o.holder
  local rec = R[h]
  local mine = rec.list
  local cur = current(rec)
  local d = rec.d
  local res = {0, 0, 0}
  -- retire cur, keeping until its expiry (at most the grace) only the
  -- rate above the holder's new one.
  local function retire(newrate)
    if cur ~= nil then
      local e = slotUp(now + grace) / 10
      if cur[4] > e then cur[4] = e end
      cur[3] = 0
      local keep = cur[1] / cur[5] - newrate
      if keep < 0 then keep = 0 end
      T.srate = T.srate - cur[1] / cur[5] + keep
      cur[1] = keep * cur[5]
      listAt(h, cur[4])
    end
  end
  if o.op == 'release' then
    if d then
      if cur ~= nil then unhold(d) end
      dequeue(d)
    end
    retire(0)
    rec.d = nil
    res = {0, 0, 1}
  else
    local want = math.floor(targetOf(h, o.want, cur ~= nil))
    if want < 1 then want = 1 end
    local wantmax = math.floor(bpool * want / pool)
    if wantmax < 1 then wantmax = 1 end
    local slack = 1
    if cur ~= nil then slack = math.max(1, math.floor(cur[1] / 5)) end
    local waiting = T.nw
    if d[3] > 0 then waiting = waiting - 1 end
    -- (a share below its target holds in proportion longer: its turn is
    -- counted in the requests it covers, not in seconds)
    local myturn = turn * math.max(1, want / cur_units(cur))
    if cur ~= nil and waiting > 0 and T.nh >= cap and now - cur[6] >= myturn
      and (tokens + (rate - T.srate) * grace >= 1 - 1e-6 or now - cur[6] >= turn_wait * myturn) then
      -- Its turn is over and others wait with no place free: yield, one
      -- place at a time (shares granted together end their turns
      -- together; yielding them all at once left places empty for
      -- seconds), when the free tokens will start the next share as
      -- this one's grace ends (else the place stays empty while they
      -- refill), or at the latest a quarter of a turn later.
      retire(0)
      unhold(d)
      if o.demand > 0 then enqueue(h, d) end
      res = {0, 0, 1}
    elseif cur ~= nil and cur[5] == fill and cur[3] > now + grace and cur[1] <= want and want - cur[1] <= slack and T.srate <= pool / fill + 1e-9
      and (2 * cur[2] >= wantmax or math.floor(tokens) < wantmax) then
      -- Renewal: the same share, a later expiry (unless its max_tokens
      -- are less than half its target and the free tokens can pay more).
      cur[3] = now + o.ttl
      cur[4] = slotUp(now + o.ttl + grace) / 10
      listAt(h, cur[4])
      res = {cur[1], cur[2], 0}
    else
      local curRate = 0
      if cur ~= nil then curRate = cur[1] / cur[5] end
      local avail = math.floor((pool / fill - (T.srate - curRate)) * fill + 1e-6)
      local u = want
      if u > avail then u = avail end
      local m = wantmax
      -- A one-token share below its holder's demand admits one request
      -- in two (or k): it gets two tokens if the free tokens have them
      -- (it then admits its rate), else exactly 1/k of its target, the
      -- rest left to refill the free tokens.
      local single = bpool * want / pool < 2
      if u < want and single then m = 2 end
      if m > math.floor(tokens) then m = math.floor(tokens) end
      -- (nor is a one-token share changed for one no better for its
      -- holder within the slack: the change would cost a bucket)
      local noBetter = single and cur ~= nil and u <= cur[1] and m <= cur[2] and cur[1] - u <= slack
        and T.srate <= pool / fill + 1e-9
      if m == 1 and u < want and single then
        local k = math.ceil(want / u)
        u = math.ceil(want / k)
        if u > avail then u = math.floor(want / (k + 1)) end
      end
      -- A holder growing its share leaves a token for the oldest waiting
      -- Envoy (a shrinking one frees rate for it); waiting ones take
      -- their turn oldest first, as far as free places and tokens go.
      local mayTake
      if cur ~= nil then
        mayTake = waiting == 0 or u < cur[1] or math.floor(tokens - m) >= 1
      elseif d[3] > 0 then
        -- (and only for at least half its target: a share of a little
        -- rate, left by one still in its grace, would take a place and a
        -- token to admit little, and change again at once)
        mayTake = d[3] - T.hq < math.min(cap - T.nh, math.floor(tokens)) and (T.nh == 0 or 2 * u >= want)
      else
        mayTake = waiting == 0 and T.nh < cap
      end
      -- (a change to the same share is a renewal: Envoy keeps its bucket)
      if cur ~= nil and u == cur[1] and m == cur[2] then noBetter = true end
      if u >= 1 and m >= 1 and mayTake and not noBetter then
        retire(u / fill)
        tokens = tokens - m
        T.srate = T.srate + u / fill
        T.held = T.held + m
        T.ne = T.ne + 1
        local s = {u, m, now + o.ttl, slotUp(now + o.ttl + grace) / 10, fill, now}
        table.insert(mine, 1, s)
        listAt(h, s[4])
        if cur == nil then
          dequeue(d)
          hold(d, o.want)
        end
        res = {u, m, 1}
      elseif cur ~= nil and cur[5] == fill and cur[3] > now + grace and T.srate <= pool / fill + 1e-9 then
        -- No room to change it now: keep it rather than collapse (unless
        -- the live shares exceed the pool: the rule was lowered).
        cur[3] = now + o.ttl
        cur[4] = slotUp(now + o.ttl + grace) / 10
        listAt(h, cur[4])
        res = {math.floor(cur[1]), cur[2], 0}
      else
        retire(0)
        if cur ~= nil then unhold(d) end
        if d[3] == 0 and o.demand > 0 then enqueue(h, d) end
        res = {0, 0, 1}
      end
    end
  end
  result[#result + 1] = res[1]
  result[#result + 1] = res[2]
  result[#result + 1] = res[3]
end
if T.ne <= 0 then T.srate, T.held, T.ne = 0, 0, 0 end

-- Floor the tokens to 6 decimals, and write what changed.
if tokens < 0 then tokens = 0 end
local tokstr = fmt(math.floor(tokens * 1e6) / 1e6)
result[#result + 1] = tokstr
local set = {'b', tokstr .. ':' .. fmt(now)}
for h in pairs(dirty) do
  local rec = R[h]
  if #rec.list == 0 then
    del[#del + 1] = 'g:' .. h
  else
    local parts = {}
    for _, s in ipairs(rec.list) do
      parts[#parts + 1] = fmt(s[1]) .. ',' .. s[2] .. ',' .. fmt(s[3]) .. ',' .. fmt(s[4]) .. ',' .. s[5] .. ',' .. fmt(s[6])
    end
    set[#set + 1] = 'g:' .. h
    set[#set + 1] = table.concat(parts, ';')
  end
  if rec.d == nil then
    del[#del + 1] = 'd:' .. h
  else
    set[#set + 1] = 'd:' .. h
    set[#set + 1] = fmt(rec.d[1]) .. ',' .. fmt(rec.d[2]) .. ',' .. rec.d[3] .. ',' .. rec.d[4]
  end
end
for n in pairs(qdel) do del[#del + 1] = 'q:' .. n end
for n, h in pairs(qset) do
  set[#set + 1] = 'q:' .. n
  set[#set + 1] = h
end
local ks, kf = {}, {}
for k in pairs(appendTo) do
  if xcount[k] == nil then ks[#ks + 1] = k; kf[#kf + 1] = 'x:' .. k end
end
if #kf > 0 then
  local counts = hmget(kf)
  for i, k in ipairs(ks) do xcount[k] = tonumber(counts[i]) or 0 end
end
for k, l in pairs(appendTo) do
  local c = xcount[k] + 1
  set[#set + 1] = 'x:' .. k
  set[#set + 1] = c
  set[#set + 1] = 'x:' .. k .. ':' .. c
  set[#set + 1] = table.concat(l, ' ')
end
local hp = {}
for b, e in pairs(hist) do hp[#hp + 1] = b .. ':' .. e[1] .. ':' .. e[2] end
set[#set + 1] = 't'
set[#set + 1] = string.format('%.9f', T.srate) .. ',' .. T.held .. ',' .. T.ne .. ',' .. T.nh .. ',' .. T.nw .. ',' ..
  string.format('%.0f', T.sw) .. ',' .. T.tq .. ',' .. T.hq .. ',' .. T.ps .. ',' .. T.ms
set[#set + 1] = 'w'
set[#set + 1] = table.concat(hp, ',')
local function each(cmd, args, step)
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end
each('HDEL', del, 500)
each('HSET', set, 500)
-- Until every share has expired and then L has refilled, plus a minute
-- (for a clock of the service's that differs from Redis's).
redis.call('PEXPIRE', key, math.ceil(((math.max(T.ms / 10, now) - now) + burst / rate + 60) * 1000))
return result
