-- Reads who holds a lock. Redis never returns an expired key, so an expired holder is never
-- reported; the counter is the holder's token because only a successful acquire advances it.
-- KEYS[1] lock (string: the holder's owner token), KEYS[2] fence counter
-- ARGV none
-- Reply: nil when nobody holds the lock, else { owner, fence, pttl }
local owner = redis.call('GET', KEYS[1])
if not owner then
  return nil
end
return { owner, redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[1]) }
