-- Releases a fill lease only if the caller still owns it (its load failed, so it fills nothing).
-- KEYS[1] lease
-- ARGV[1] lease owner token
-- Reply: 1 released, 0 the lease had expired or belongs to another caller
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
