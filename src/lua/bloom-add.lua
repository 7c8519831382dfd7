-- Adds items to one shard of a Bloom filter (src/primitives/bloom.ts, docs/bloom.md).
-- KEYS[1] the shard's head (a hash): `live`/`live_shape` the generation readers use, `building`/
-- `building_shape` the one a rebuild is filling, `built` how many of the rebuild's own calls it took,
-- `rebuilds` how many rebuilds of the shard started (each rebuild's number).
-- A generation's bits are the string KEYS[1]:<generation> (same hash tag); bit 0 is set when it
-- went live, bit 1 when the rebuild created it; positions start at bit 8.
-- ARGV[1] '' for an application's add, or the generation a rebuild is filling (its own adds)
-- ARGV[2] the caller's shape, ARGV[3] k, ARGV[4] the rebuild's number (0 for an application's add)
-- ARGV[5..] k bit offsets per item
-- An application's add sets the bits in the live generation (unless its bits are gone) and in the
-- one being built, so that a rebuild under way misses no add made meanwhile. A rebuild's add sets
-- them in its own generation only, and counts the call in `built`.
-- Reply: one character per item, '1' when one of its bits was clear (it was not in the filter)
-- and '0' when all were set: from the live generation, else from the one being built; nil when
-- neither holds this shape (nothing written). A rebuild's add whose generation is not the one being
-- built any more: -1 when a later rebuild started since, -2 when Redis lost the rebuild's state.
-- Sets the k bits of each item (ARGV[5..]) in one generation with BITFIELD, up to 1000 operations a
-- call (unpack is bounded by Lua's C stack): per item '1' when one of its bits was clear before.
local function set_bits(key, k)
  local out, items = {}, 0
  local new, seen = '0', 0
  local last = #ARGV
  for from = 5, last, 1000 do
    local ops, n = {}, 0
    for i = from, math.min(last, from + 999) do
      ops[n + 1], ops[n + 2], ops[n + 3], ops[n + 4] = 'SET', 'u1', ARGV[i], '1'
      n = n + 4
    end
    local old = redis.call('BITFIELD', key, unpack(ops))
    for j = 1, #old do
      if old[j] == 0 then
        new = '1'
      end
      seen = seen + 1
      if seen == k then
        items = items + 1
        out[items] = new
        new, seen = '0', 0
      end
    end
  end
  return table.concat(out)
end
local s = redis.call('HMGET', KEYS[1], 'live', 'live_shape', 'building', 'building_shape', 'rebuilds')
local k = tonumber(ARGV[3])
if ARGV[1] ~= '' then
  if s[3] ~= ARGV[1] then
    return tonumber(s[5] or '0') > tonumber(ARGV[4]) and -1 or -2
  end
  redis.call('HINCRBY', KEYS[1], 'built', 1)
  return set_bits(KEYS[1] .. ':' .. ARGV[1], k)
end
local reply = false
if s[3] and s[4] == ARGV[2] then
  reply = set_bits(KEYS[1] .. ':' .. s[3], k)
end
if s[1] and s[2] == ARGV[2] then
  local live = KEYS[1] .. ':' .. s[1]
  -- Bits that are gone (bit 0 clear) are not written: that would only make a partial string.
  if redis.call('GETBIT', live, 0) == 1 then
    reply = set_bits(live, k)
  end
end
return reply
