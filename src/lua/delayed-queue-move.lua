-- Moves what is due from this instance's delayed set to the shared ready list, removing exactly
-- the members it moved (never a score range, which would swallow a member added in between).
-- KEYS[1] this instance's delayed set (sorted set: id -> due time in epoch ms)
-- KEYS[2] the ready list (ids, taken from the left)
-- ARGV[1] at most this many ids
-- Reply: the number of ids moved, earliest due first
-- #include now
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then
  return 0
end
redis.call('RPUSH', KEYS[2], unpack(due))
redis.call('ZREM', KEYS[1], unpack(due))
return #due
