-- Adds to one shard of a sharded counter, each item at most once per id (when it has one): named
-- counts in a hash, a member in a HyperLogLog (distinct count), the counted ids in a set. Counts
-- are exact integers saturating at +-(2^53 - 1), so they read back exactly as JavaScript numbers.
-- KEYS[1] counts (hash), KEYS[2] distinct members (HyperLogLog), KEYS[3] counted ids (set); one hash tag
-- ARGV[1] lifetime of the three keys in ms, renewed by each call (0: none)
-- then per item: id ('': not deduplicated), member ('': none), n, and n field/amount pairs
-- Reply: how many items were counted now (the others had been counted before)
local MAX = 9007199254740991
local counted = 0
local at = 2
while at <= #ARGV do
  local id, member, n = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  if id == '' or redis.call('SADD', KEYS[3], id) == 1 then
    for f = at + 3, at + 1 + 2 * n, 2 do
      -- Stored counts and amounts are within 2^53 - 1, so the 64-bit sum cannot overflow.
      local value = redis.call('HINCRBY', KEYS[1], ARGV[f], ARGV[f + 1])
      if value > MAX then
        redis.call('HSET', KEYS[1], ARGV[f], string.format('%.0f', MAX))
      elseif value < -MAX then
        redis.call('HSET', KEYS[1], ARGV[f], string.format('%.0f', -MAX))
      end
    end
    if member ~= '' then
      redis.call('PFADD', KEYS[2], member)
    end
    counted = counted + 1
  end
  at = at + 3 + 2 * n
end
if ARGV[1] ~= '0' then
  for k = 1, 3 do
    redis.call('PEXPIRE', KEYS[k], ARGV[1])
  end
end
return counted
