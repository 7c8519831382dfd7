-- A reader's side of follow and unfollow (src/primitives/feed.ts).
-- KEYS[1] feed (sorted set), KEYS[2] following (set), KEYS[3] pulled (set), KEYS[4] meta (hash): one reader's
-- ARGV[1] 'follow', ARGV[2] producer, ARGV[3] maxFollowing. Reply {-1} the feed is not built
--   (nothing to do here: a build asks the application), {-2} the reader follows maxFollowing
--   producers already, else {1 added or 0 followed already, the reader's activity mark}.
-- ARGV[1] 'followed', ARGV[2] producer, ARGV[3] '1' read by pull, ARGV[4] feedMaxItems, then score,
--   member pairs of its recent items (pushed producers). Reply: how many items were added.
-- ARGV[1] 'unfollow', ARGV[2] producer. Reply -1 the feed is not built, 1 removed, 0 not followed.
-- 'follow' and 'unfollow' drop the token of a build under way: its application's answer may predate
-- this change, so it builds again.
-- #include feed-reader
local op, producer = ARGV[1], ARGV[2]
if op ~= 'followed' then redis.call('HDEL', KEYS[4], 'build') end
if op == 'unfollow' then
  if not readerBuilt() then return -1 end
  redis.call('SREM', KEYS[3], producer)
  return redis.call('SREM', KEYS[2], producer)
end
if op == 'follow' then
  if not readerBuilt() then return {-1} end
  local mark = redis.call('HGET', KEYS[4], 'mark')
  if redis.call('SISMEMBER', KEYS[2], producer) == 1 then return {0, mark} end
  if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[3]) then return {-2} end
  redis.call('SADD', KEYS[2], producer)
  readerSameExpiry(KEYS[2])
  return {1, mark}
end
-- 'followed': still following (an unfollow may have come in between) and built.
if not readerBuilt() or redis.call('SISMEMBER', KEYS[2], producer) == 0 then return 0 end
if ARGV[3] == '1' then
  redis.call('SADD', KEYS[3], producer)
  readerSameExpiry(KEYS[3])
else
  redis.call('SREM', KEYS[3], producer)
end
local added = 0
if #ARGV > 4 then
  for i = 5, #ARGV, 1000 do
    added = added + redis.call('ZADD', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
end
return added
