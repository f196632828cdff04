-- tokengate-rls: one fixed-window counter of envoyproxy/ratelimit's kind.
--
-- KEYS[1]  the counter: the window's key (its start is part of the name)
-- ARGV[1]  hits to add (>= 0; 0 only reads)
-- ARGV[2]  the counter's TTL in seconds: the window's length
-- ARGV[3]  the limit, N per window
--
-- As envoyproxy/ratelimit's pipeline (INCRBY, then EXPIRE): every call
-- counts, over the limit or not, and a call is over the limit when the
-- count after it is above N.
--
-- Returns {within the limit (1/0), the count after the call as a string}.

local n = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
local ok = 0
if n <= tonumber(ARGV[3]) then
  ok = 1
end
return {ok, tostring(n)}
