-- Reads items in one shard of a Bloom filter (src/primitives/bloom.ts, docs/bloom.md).
-- KEYS[1] the shard's head (a hash): `live` is the generation readers use and `live_shape` its
-- shape; that generation's bits are the string KEYS[1]:<live> (same hash tag). Bit 0 of the bits
-- is set when the generation went live, complete; the items' bits start at bit 8.
-- ARGV[1] the caller's shape (format, shards, bits per key, hashes): bits of another shape mean
-- nothing to it. ARGV[2] k, ARGV[3..] k bit offsets per item (none: only "is this shard built?")
-- Reply: nil when the shard cannot answer (no live generation, another shape, or its bits are gone:
-- bit 0 clear), else one character per item, '1' maybe present and '0' absent.
local head = redis.call('HMGET', KEYS[1], 'live', 'live_shape')
if not head[1] or head[2] ~= ARGV[1] then
  return false
end
local bits = KEYS[1] .. ':' .. head[1]
if redis.call('GETBIT', bits, 0) == 0 then
  return false
end
-- GETBIT bit by bit: an absent item stops at its first clear bit (about two reads on average in a
-- filter filled to its size), where BITFIELD would read all k.
local k = tonumber(ARGV[2])
local out, n = {}, 0
for at = 3, #ARGV, k do
  local hit = '1'
  for i = at, at + k - 1 do
    if redis.call('GETBIT', bits, ARGV[i]) == 0 then
      hit = '0'
      break
    end
  end
  n = n + 1
  out[n] = hit
end
return table.concat(out)
