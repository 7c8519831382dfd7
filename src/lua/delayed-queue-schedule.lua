-- Schedules an id into this instance's delayed set, unless it is already there: ZADD NX, so a
-- producer scheduling the same id again can never postpone it (the first due time stays).
-- KEYS[1] this instance's delayed set (sorted set: id -> due time, epoch ms of the app clock)
-- KEYS[2] the queue's instance registry (set of instance ids)
-- ARGV[1] id, ARGV[2] due time in epoch ms, ARGV[3] this instance's id
-- Reply: 1 scheduled, 0 the id was already in this instance's delayed set (unchanged)
-- Registering here too means a set is never left where no live instance would adopt it.
redis.call('SADD', KEYS[2], ARGV[3])
return redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
