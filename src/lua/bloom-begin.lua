-- Starts a rebuild of one shard of a Bloom filter (src/primitives/bloom.ts): creates the new
-- generation's bits at their full size, all clear but bit 1 (created by a rebuild), and names it
-- `building` in the head. A generation an earlier rebuild left unfinished is deleted.
-- KEYS[1] the shard's head (a hash; see bloom-add.lua); the bits are KEYS[1]:<generation>
-- ARGV[1] the new generation (random), ARGV[2] its shape, ARGV[3] its size in bits (a multiple of 8)
-- Reply: the rebuild's number (`rebuilds`, counted per shard), which tells a later rebuild from a lost one
local old = redis.call('HGET', KEYS[1], 'building')
if old and old ~= ARGV[1] then
  redis.call('UNLINK', KEYS[1] .. ':' .. old)
end
local bits = KEYS[1] .. ':' .. ARGV[1]
redis.call('DEL', bits)
redis.call('SETBIT', bits, tonumber(ARGV[3]) - 1, 0)
redis.call('SETBIT', bits, 1, 1)
redis.call('HSET', KEYS[1], 'building', ARGV[1], 'building_shape', ARGV[2], 'built', 0)
return redis.call('HINCRBY', KEYS[1], 'rebuilds', 1)
