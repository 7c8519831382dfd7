-- Removes a waiting id: every copy from the ready list and from each given delayed set. An id
-- already taken (in a processing list) is left to its handler.
-- KEYS[1] the ready list, KEYS[2..n] the delayed sets (sorted sets) of the registered instances
-- ARGV[1] id
-- Reply: the number of entries removed (0: it was not waiting)
local removed = redis.call('LREM', KEYS[1], 0, ARGV[1])
for i = 2, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[i], ARGV[1])
end
return removed
