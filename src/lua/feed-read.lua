-- One page of a reader's feed (its pushed items), for src/primitives/feed.ts.
-- KEYS[1] feed (sorted set), KEYS[2] following (set), KEYS[3] pulled (set), KEYS[4] meta (hash): one reader's
-- ARGV[1] now (ms), ARGV[2] how often the reader's activity is marked (ms), ARGV[3] cursor at ('' from
-- the newest), ARGV[4] cursor id, ARGV[5] k (items wanted), ARGV[6] '1' to list the pulled producers,
-- ARGV[7] the feed's loss token (changed when a producer's keys were found lost)
-- Reply: {0} the feed must be built (missing, being built, or built before the last loss: a
-- producer that lost its followers set fanned out to nobody); {1, following} the activity mark is due (mark, then read
-- again); else {2, exhausted (1 when nothing is left after the items), pulled producers still
-- followed, {member, score, ...}}. Items of producers no longer followed are skipped, and removed.
-- #include feed-reader
-- #include feed-range
if not readerBuilt() or (redis.call('HGET', KEYS[4], 'losses') or '') ~= ARGV[7] then return {0} end
if tonumber(ARGV[1]) - tonumber(redis.call('HGET', KEYS[4], 'mark')) >= tonumber(ARGV[2]) then
  return {1, redis.call('SMEMBERS', KEYS[2])}
end
local pulled = {}
if ARGV[6] == '1' then
  for _, producer in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    if redis.call('SISMEMBER', KEYS[2], producer) == 1 then pulled[#pulled + 1] = producer end
  end
end
local unfollowed = {}
local items, exhausted = feedRange(KEYS[1], ARGV[3], ARGV[4], tonumber(ARGV[5]), function(member)
  local space = string.find(member, ' ', 1, true)
  if space and redis.call('SISMEMBER', KEYS[2], string.sub(member, space + 1)) == 1 then return true end
  unfollowed[#unfollowed + 1] = member
  return false
end, 16)
-- After the scan: removing while paging by offset would skip members.
for i = 1, #unfollowed, 1000 do
  redis.call('ZREM', KEYS[1], unpack(unfollowed, i, math.min(i + 999, #unfollowed)))
end
return {2, exhausted and 1 or 0, pulled, items}
