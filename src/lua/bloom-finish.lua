-- Ends a rebuild of one shard of a Bloom filter (src/primitives/bloom.ts).
-- KEYS[1] the shard's bits, KEYS[2] the bits being built, KEYS[3] the rebuild's state (a hash; see
-- bloom-add.lua); one hash tag
-- ARGV[1] the rebuild's generation, ARGV[2] 'switch' or 'abort', ARGV[3] how many calls the
-- rebuild made to this shard, ARGV[4] the size of the bits in bytes, ARGV[5] the rebuild's number
-- switch: when the bits built are complete (every call counted, the rebuild's mark and full size
-- still there), sets their bit 0 and renames them over the live bits, one step for readers.
-- Reply: the shape the live bits had before ('' when none); -1 when a later rebuild started since;
-- -2 when Redis lost some of the rebuild's writes, and then the bits built are deleted.
-- abort: deletes the bits being built if they are still this rebuild's. Reply: 1
local state = redis.call('HMGET', KEYS[3], 'gen', 'built', 'rebuilds', 'shape', 'live_shape')
if state[1] ~= ARGV[1] then
  if ARGV[2] == 'abort' then
    return 1
  end
  return tonumber(state[3] or '0') > tonumber(ARGV[5]) and -1 or -2
end
redis.call('HDEL', KEYS[3], 'gen', 'built', 'shape')
local complete = ARGV[2] == 'switch'
  and tonumber(state[2]) >= tonumber(ARGV[3])
  and redis.call('GETBIT', KEYS[2], 1) == 1
  and redis.call('STRLEN', KEYS[2]) == tonumber(ARGV[4])
if not complete then
  redis.call('UNLINK', KEYS[2])
  return ARGV[2] == 'abort' and 1 or -2
end
redis.call('SETBIT', KEYS[2], 0, 1)
redis.call('RENAME', KEYS[2], KEYS[1])
redis.call('HSET', KEYS[3], 'live_shape', state[4])
return state[5] or ''
