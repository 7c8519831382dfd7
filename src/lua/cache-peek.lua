-- Reads one entry without taking a lease or creating a generation (get, has, and a route's
-- prefetch): an entry counts only while it is fresh (a stale copy is served by getOrLoad alone,
-- which also refreshes it).
-- KEYS[1] value (the format of cache-get.lua)
-- ARGV[1] optional: XFetch beta (a prefetch, with earlyRefreshBeta > 0)   ARGV[2] its random draw in (0, 1]
--         (time comes from Redis)
-- Reply: {} when absent, past its soft TTL or (with ARGV[1]) due for an early refresh, else
--        { payload[, tags] } with tags ("tag=generation,...", as recorded at the fill) only for a
--        tagged entry, for the caller to check
local raw = redis.call('GET', KEYS[1])
if not raw then
  return {}
end
local start = 1
local tags = nil
if string.byte(raw, 1) == 35 then
  start = string.find(raw, '|', 2, true) + 1
  tags = string.sub(raw, 2, start - 2)
end
local a = string.find(raw, '|', start, true)
local b = string.find(raw, '|', a + 1, true)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local softAt = tonumber(string.sub(raw, start, a - 1))
if now >= softAt then
  return {}
end
-- The XFetch test of cache-get.lua with the same draw: the caller then reads the entry with
-- cache-get.lua and that draw, which chooses the early refresh again (the test only gets truer as
-- time passes) and takes the lease.
local beta = tonumber(ARGV[1] or '0')
if beta > 0 and now - tonumber(string.sub(raw, a + 1, b - 1)) * beta * math.log(tonumber(ARGV[2])) >= softAt then
  return {}
end
return { string.sub(raw, b + 1), tags }
