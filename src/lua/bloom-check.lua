-- Reads items in one shard of a Bloom filter (src/primitives/bloom.ts, docs/bloom.md).
-- KEYS[1] the shard's bits (a string). Its first 64 bits are a header: bit 0 is set when the bits
-- went live complete (the end of a rebuild), bits 8-39 hold the shape id (u32) of the options
-- they were built for; the items' bits follow.
-- ARGV[1] the caller's shape id, ARGV[2] k, ARGV[3] the bit offsets, k per item, in decimal separated
-- by spaces (one argument however large the batch)
-- Reply: nil when the shard cannot answer (its bits are missing, not complete, or of another
-- shape), else one character per item: '1' maybe present, '0' absent.
local head = redis.call('BITFIELD_RO', KEYS[1], 'GET', 'u1', 0, 'GET', 'u32', 8)
if head[1] ~= 1 or head[2] ~= tonumber(ARGV[1]) then
  return false
end
-- GETBIT bit by bit: an absent item stops at its first clear bit (about two reads on average in a
-- filter filled to its size), where BITFIELD would read all k.
local k = tonumber(ARGV[2])
local out, n = {}, 0
local hit, seen = '1', 0
for offset in string.gmatch(ARGV[3], '%d+') do
  if hit == '1' and redis.call('GETBIT', KEYS[1], offset) == 0 then
    hit = '0'
  end
  seen = seen + 1
  if seen == k then
    n = n + 1
    out[n] = hit
    hit, seen = '1', 0
  end
end
return table.concat(out)
