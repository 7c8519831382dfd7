-- Extends a lock only if the caller still holds it: an expired holder cannot revive a lock that
-- another owner took (or that nobody holds any more).
-- KEYS[1] lock (string: the holder's owner token)
-- ARGV[1] owner token of the caller's handle, ARGV[2] new ttl in ms, counted from now
-- Reply: 1 extended, 0 the lock is not (or no longer) the caller's
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
