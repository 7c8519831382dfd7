-- Stores a value the application gives (a write-through after a committed change). Like an
-- invalidation it replaces the generation and drops any fill lease, so a fill whose load predates
-- this write is refused; then it stores the value.
-- KEYS[1] value   KEYS[2] generation   KEYS[3] lease
-- ARGV[1] a fresh generation token   ARGV[2] generation TTL ms
-- ARGV[3] soft TTL ms   ARGV[4] hard TTL ms (>= soft)   ARGV[5] payload
-- ARGV[6] "tag=generation,..." of the entry's tags ('' for an entry without tags)
-- Reply: 1
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[3])
-- #include now
local softAt = string.format('%.0f', now + tonumber(ARGV[3]))
local head = ''
if ARGV[6] ~= '' then
  head = '#' .. ARGV[6] .. '|'
end
redis.call('SET', KEYS[1], head .. softAt .. '|0|' .. ARGV[5], 'PX', ARGV[4])
return 1
