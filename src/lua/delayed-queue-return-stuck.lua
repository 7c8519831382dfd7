-- The watchdog: returns to the ready list the ids of one instance's processing list taken longer
-- ago than the visibility timeout (every occurrence of such an id, so none is left untracked).
-- KEYS[1] the instance's processing list, KEYS[2] its take times (sorted set: id -> Redis ms)
-- KEYS[3] the ready list
-- ARGV[1] visibility timeout in ms, ARGV[2] at most this many ids
-- Reply: the number of list entries returned to ready
-- #include now
local stuck = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0, tonumber(ARGV[2]))
local returned = 0
for _, id in ipairs(stuck) do
  local n = redis.call('LREM', KEYS[1], 0, id)
  for _ = 1, n do
    redis.call('RPUSH', KEYS[3], id)
  end
  redis.call('ZREM', KEYS[2], id)
  returned = returned + n
end
return returned
