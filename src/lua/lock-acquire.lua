-- Takes a lock if nobody holds it and hands the new holder the next fencing token. One script so
-- that taking the lock and drawing its token are one step: two callers can never both see the lock
-- free (SET NX PX decides), and a token is drawn only by the caller that got the lock.
-- KEYS[1] lock (string: the holder's owner token; its TTL is the lock's)
-- KEYS[2] fence counter (string integer, no TTL, same hash tag as KEYS[1])
-- ARGV[1] owner token, ARGV[2] ttl in ms
-- Reply: { 1, fence } the caller holds the lock with this token
--        { 0, pttl } another owner holds it for pttl more ms
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return { 0, redis.call('PTTL', KEYS[1]) }
end
-- The token only grows: INCR, floored at the Redis clock in microseconds, so a counter lost or left
-- behind by a failover still hands out a larger token than any the old primary gave.
local fence = redis.call('INCR', KEYS[2])
-- #include now
if fence < tonumber(now_us) then
  redis.call('SET', KEYS[2], now_us)
  fence = tonumber(now_us)
end
return { 1, fence }
