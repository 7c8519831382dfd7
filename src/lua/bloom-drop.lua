-- Deletes one shard of a Bloom filter (src/primitives/bloom.ts): its live generation, the one being
-- built if any, and its head.
-- KEYS[1] the shard's head (a hash; see bloom-add.lua); the bits are KEYS[1]:<generation>
-- Reply: how many keys were deleted
local s = redis.call('HMGET', KEYS[1], 'live', 'building')
local deleted = redis.call('UNLINK', KEYS[1])
for i = 1, 2 do
  if s[i] then
    deleted = deleted + redis.call('UNLINK', KEYS[1] .. ':' .. s[i])
  end
end
return deleted
