-- Acknowledges a taken id: removes one occurrence from this instance's processing list, and its
-- take time once no occurrence is left.
-- KEYS[1] this instance's processing list, KEYS[2] this instance's take times (sorted set)
-- ARGV[1] id
-- Reply: 1 acknowledged, 0 the id was not in the processing list (the watchdog or an adopter
--        returned it to ready: it will be delivered again)
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
if not redis.call('LPOS', KEYS[1], ARGV[1]) then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
