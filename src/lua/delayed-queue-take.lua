-- Takes the next ready id into this instance's processing list and records when (one step, so an
-- id in a processing list always has a take time for the watchdog to judge).
-- KEYS[1] the ready list, KEYS[2] this instance's processing list
-- KEYS[3] this instance's take times (sorted set: id -> Redis time in ms of the latest take)
-- KEYS[4] the instance registry (set of instance ids)
-- ARGV[1] this instance's id
-- Reply: the id, or nil when nothing is ready
local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
if not id then
  return nil
end
-- #include now
redis.call('ZADD', KEYS[3], now, id)
-- Registered, so the watchdog and adoption of other instances see this processing list.
redis.call('SADD', KEYS[4], ARGV[1])
return id
