-- Reads one entry without taking a lease or creating a generation (get and has): an entry counts
-- only while it is fresh (a stale copy is served by getOrLoad alone, which also refreshes it).
-- KEYS[1] value (the format of cache-get.lua)
-- ARGV: none (time comes from Redis)
-- Reply: {} when absent or past its soft TTL, else { payload[, tags] } with tags ("tag=generation,...",
--        as recorded at the fill) only for a tagged entry, for the caller to check
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
if now >= tonumber(string.sub(raw, start, a - 1)) then
  return {}
end
return { string.sub(raw, b + 1), tags }
