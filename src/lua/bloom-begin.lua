-- Starts a rebuild of one shard of a Bloom filter (src/primitives/bloom.ts): creates the bits to
-- build at their full size, all clear but the header (bit 1: made by a rebuild; bits 8-39: the
-- shape id), and records the rebuild in the shard's state. Bits an earlier rebuild left are replaced.
-- KEYS[1] the bits being built, KEYS[2] the rebuild's state (a hash; see bloom-add.lua); one hash tag
-- ARGV[1] the rebuild's generation (random), ARGV[2] the shape id, ARGV[3] the size in bits (a
-- multiple of 8), ARGV[4] the shape as text
-- Reply: the rebuild's number (`rebuilds`, counted per shard), which tells a later rebuild from a lost one
redis.call('UNLINK', KEYS[1])
redis.call('SETBIT', KEYS[1], tonumber(ARGV[3]) - 1, 0)
redis.call('BITFIELD', KEYS[1], 'SET', 'u1', 1, 1, 'SET', 'u32', 8, ARGV[2])
redis.call('HSET', KEYS[2], 'gen', ARGV[1], 'built', 0, 'shape', ARGV[4])
return redis.call('HINCRBY', KEYS[2], 'rebuilds', 1)
