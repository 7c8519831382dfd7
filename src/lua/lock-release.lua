-- Releases a lock only if the caller still holds it (compare and delete in one step): a holder
-- whose lock expired, and was taken by another owner since, never deletes that owner's lock.
-- KEYS[1] lock (string: the holder's owner token)
-- ARGV[1] owner token of the caller's handle
-- Reply: 1 released, 0 the lock is not (or no longer) the caller's
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
