-- Records a reader's activity mark (src/primitives/feed.ts) once its score is in the followers sets
-- of the producers it follows: the modes found there, the mark, and the expiry of its keys.
-- KEYS[1] feed (sorted set), KEYS[2] following (set), KEYS[3] pulled (set), KEYS[4] meta (hash): one reader's
-- ARGV[1] the mark (ms), ARGV[2] expiry of the reader's keys (unix ms), ARGV[3] feedMaxItems,
-- ARGV[4] n, then n producer, '1' or '0' (read by pull) pairs, then score, member pairs of items to
-- add (the recent items of producers no longer read by pull)
-- Reply: 1, or 0 when the feed is not built (nothing done: the next read builds it)
-- #include feed-reader
if not readerBuilt() then return 0 end
local itemsAt = 5 + 2 * tonumber(ARGV[4])
for i = 5, itemsAt - 1, 2 do
  if ARGV[i + 1] == '1' then
    redis.call('SADD', KEYS[3], ARGV[i])
  else
    redis.call('SREM', KEYS[3], ARGV[i])
  end
end
if itemsAt < #ARGV then
  readerAddAll('ZADD', KEYS[1], ARGV, itemsAt, #ARGV)
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
end
redis.call('HSET', KEYS[4], 'mark', ARGV[1])
for i = 1, 4 do redis.call('PEXPIREAT', KEYS[i], ARGV[2]) end
return 1
