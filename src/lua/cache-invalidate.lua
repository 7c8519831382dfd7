-- Invalidates one entry after the source of truth changed: drops the value and any fill lease,
-- and replaces the generation with a new unique token, so a fill that read the old generation
-- (its load may predate the change) is refused. A unique token, unlike a counter, stays a fence
-- even if an evicting Redis drops the generation key and a reader recreates it.
-- KEYS[1] value   KEYS[2] generation   KEYS[3] lease
-- ARGV[1] a fresh generation token   ARGV[2] generation TTL ms
-- Reply: 1
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[1], KEYS[3])
return 1
