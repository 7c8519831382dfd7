-- Ends a rebuild of one shard of a Bloom filter (src/primitives/bloom.ts).
-- KEYS[1] the shard's head (a hash; see bloom-add.lua); the bits are KEYS[1]:<generation>
-- ARGV[1] the rebuild's generation, ARGV[2] 'switch' or 'abort'
-- ARGV[3] (switch) how many calls the rebuild made to this shard: `built` must count them all
-- ARGV[4] (switch) the size of the bits in bytes, ARGV[5] the rebuild's number (from bloom-begin.lua)
-- switch: when the generation is complete, sets its bit 0 and makes it the live one, in one step,
-- and deletes the previous live generation. Reply: the previous live shape ('' when none); -1 when
-- a later rebuild started since; -2 when Redis lost some of the rebuild's writes (its state is gone,
-- fewer calls counted, or the bits were recreated), and then the generation is deleted.
-- abort: deletes the generation if it is still the one being built. Reply: 1
local s = redis.call('HMGET', KEYS[1], 'building', 'building_shape', 'built', 'live_shape', 'live', 'rebuilds')
local bits = KEYS[1] .. ':' .. ARGV[1]
if s[1] ~= ARGV[1] then
  if ARGV[2] == 'abort' then
    return 1
  end
  return tonumber(s[6] or '0') > tonumber(ARGV[5]) and -1 or -2
end
local complete = ARGV[2] == 'switch'
  and tonumber(s[3]) >= tonumber(ARGV[3])
  and redis.call('GETBIT', bits, 1) == 1
  and redis.call('STRLEN', bits) == tonumber(ARGV[4])
redis.call('HDEL', KEYS[1], 'building', 'building_shape', 'built')
if not complete then
  redis.call('UNLINK', bits)
  return ARGV[2] == 'abort' and 1 or -2
end
redis.call('SETBIT', bits, 0, 1)
if s[5] then
  redis.call('UNLINK', KEYS[1] .. ':' .. s[5])
end
redis.call('HSET', KEYS[1], 'live', ARGV[1], 'live_shape', s[2])
return s[4] or ''
