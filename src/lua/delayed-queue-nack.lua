-- Gives a taken id back for a later attempt: out of this instance's processing list and into its
-- delayed set, due delay ms from now on the Redis clock, in one step (never in both, never lost).
-- KEYS[1] this instance's processing list, KEYS[2] this instance's take times (sorted set)
-- KEYS[3] this instance's delayed set, KEYS[4] the instance registry
-- ARGV[1] id, ARGV[2] delay in ms, ARGV[3] this instance's id
-- Reply: 1 rescheduled, 0 the id was not in the processing list (left as it is)
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
if not redis.call('LPOS', KEYS[1], ARGV[1]) then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
-- #include now
redis.call('SADD', KEYS[4], ARGV[3])
-- LT: an id already scheduled here keeps the earlier of the two due times (never postponed).
redis.call('ZADD', KEYS[3], 'LT', now + tonumber(ARGV[2]), ARGV[1])
return 1
