-- Reads the generation of one tag, creating it with a fresh token when absent, so an entry always
-- records a token that no later generation of its tag can equal (an invalidation writes a new
-- random token; an expired or evicted tag comes back with another one). Each tag lives in its own
-- slot, so a tagged read sends one call per tag, concurrently with its cache-get.lua.
-- KEYS[1] tag generation
-- ARGV[1] a fresh generation token   ARGV[2] TTL ms of a created key
-- ARGV[3] '1': also extend the TTL to at least ARGV[2] (before a fill: the tag's generation must
--         outlive the entry that records it)
-- Reply: the generation
local generation = redis.call('GET', KEYS[1])
if not generation then
  generation = ARGV[1]
  redis.call('SET', KEYS[1], generation, 'PX', ARGV[2])
elseif ARGV[3] == '1' and redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return generation
