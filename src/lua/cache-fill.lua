-- Stores a loaded value unless an invalidation happened since its generation was read, and
-- releases the caller's lease (compare-and-delete: a lease taken over by another is left alone).
-- KEYS[1] value   KEYS[2] generation   KEYS[3] lease
-- ARGV[1] generation read before loading ('' skips the fence: only to demonstrate the race)
-- ARGV[2] lease owner token   ARGV[3] soft TTL ms   ARGV[4] hard TTL ms (>= soft)
-- ARGV[5] how long the load took, ms (XFetch's delta)   ARGV[6] payload   ARGV[7] generation TTL ms
-- ARGV[8] optional: "tag=generation,..." of the entry's tags, read before loading (tagged entries)
-- Reply: 1 stored, 0 refused because the generation moved (a stale value was fenced off)
if redis.call('GET', KEYS[3]) == ARGV[2] then
  redis.call('DEL', KEYS[3])
end
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
-- #include now
local softAt = string.format('%.0f', now + tonumber(ARGV[3]))
local head = ''
if ARGV[8] and ARGV[8] ~= '' then
  head = '#' .. ARGV[8] .. '|'
end
redis.call('SET', KEYS[1], head .. softAt .. '|' .. ARGV[5] .. '|' .. ARGV[6], 'PX', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return 1
