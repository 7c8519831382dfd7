-- Extends the lease of a processing record while its owner's handler still runs.
-- KEYS[1] record (a Hash while processing, a String once done)
-- ARGV[1] owner token, ARGV[2] lease in ms
-- Reply: 1 when renewed; 0 when the record is gone, done, or owned by another token (taken over)
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return 0
end
local record = redis.call('HMGET', KEYS[1], 'state', 'token')
if record[1] ~= 'processing' or record[2] ~= ARGV[1] then
  return 0
end
-- #include now
redis.call('HSET', KEYS[1], 'leaseUntil', now + tonumber(ARGV[2]))
return 1
