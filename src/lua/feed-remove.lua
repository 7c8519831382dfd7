-- Removes an item (src/primitives/feed.ts): out of its producer's timeline, and into its deleted
-- set, which reads check the feeds' copies against.
-- KEYS[1] timeline (sorted set), KEYS[2] deleted (sorted set: item id -> at): one producer's
-- ARGV[1] item id, ARGV[2] at (ms), ARGV[3] how many deletions the set keeps (the newest by at),
-- ARGV[4] its TTL (ms), renewed by each removal
-- Reply: 1 when the timeline held the item, else 0
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(tonumber(ARGV[3]) + 1))
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return removed
