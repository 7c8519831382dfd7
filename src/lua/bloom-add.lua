-- Adds items to one shard of a Bloom filter (src/primitives/bloom.ts, docs/bloom.md).
-- KEYS[1] the shard's bits, KEYS[2] the bits a rebuild is filling, KEYS[3] the rebuild's state
-- (a hash: `gen` the rebuild under way, `built` how many of its calls this shard took, `rebuilds`
-- how many rebuilds of the shard started); one hash tag. Bits start with a 64-bit header: bit 0
-- set when they went live complete, bit 1 set when a rebuild created them, bits 8-39 the shape id.
-- ARGV[1] '' for an application's add, or the generation of the rebuild making this call
-- ARGV[2] the caller's shape id, ARGV[3] k, ARGV[4] the rebuild's number (0 for an application's add)
-- ARGV[5] the bit offsets, k per item, in decimal separated by spaces
-- An application's add sets the bits in the live bits (when complete and of this shape) and in the
-- ones being built (when there, of this shape), so that a rebuild under way misses no add made
-- meanwhile. A rebuild's add sets them in the bits being built only, and counts the call.
-- Reply: one character per item, '1' when one of its bits was clear (it was not in the filter) and
-- '0' when all were set: from the live bits, else from those being built; nil when neither is
-- there for this shape (nothing written). A rebuild's add that is not the one under way any more:
-- -1 when a later rebuild started since, -2 when Redis lost the rebuild's state or bits.
local shape, k = tonumber(ARGV[2]), tonumber(ARGV[3])

-- Sets the k bits of each item with BITFIELD, up to 1000 operations a call (unpack is bounded by
-- Lua's C stack): per item '1' when one of its bits was clear before.
local function set_bits(key)
  local out, items = {}, 0
  local new, seen = '0', 0
  local ops, n = {}, 0
  local function flush()
    local old = redis.call('BITFIELD', key, unpack(ops, 1, n))
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
    n = 0
  end
  for offset in string.gmatch(ARGV[5], '%d+') do
    ops[n + 1], ops[n + 2], ops[n + 3], ops[n + 4] = 'SET', 'u1', offset, '1'
    n = n + 4
    if n == 4000 then
      flush()
    end
  end
  if n > 0 then
    flush()
  end
  return table.concat(out)
end

-- { live complete, made by a rebuild, shape id } of bits (all 0 when the key is missing).
local function header(key)
  return redis.call('BITFIELD_RO', key, 'GET', 'u1', 0, 'GET', 'u1', 1, 'GET', 'u32', 8)
end

if ARGV[1] ~= '' then
  local state = redis.call('HMGET', KEYS[3], 'gen', 'rebuilds')
  if state[1] ~= ARGV[1] then
    return tonumber(state[2] or '0') > tonumber(ARGV[4]) and -1 or -2
  end
  -- Bits being built that are gone are not recreated here: the switch would find them partial.
  if header(KEYS[2])[2] ~= 1 then
    return -2
  end
  redis.call('HINCRBY', KEYS[3], 'built', 1)
  return set_bits(KEYS[2])
end
local reply = false
local building = header(KEYS[2])
if building[2] == 1 and building[3] == shape then
  reply = set_bits(KEYS[2])
end
local live = header(KEYS[1])
if live[1] == 1 and live[3] == shape then
  reply = set_bits(KEYS[1])
end
return reply
