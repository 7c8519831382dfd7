-- Deletes a processing record so the client may retry (5xx, thrown error), only for the owner's
-- token: a losing or superseded request can never delete the record another request owns.
-- KEYS[1] record (a Hash while processing, a String once done)
-- ARGV[1] owner token
-- Reply: 1 when deleted, 0 when the caller no longer owns the record
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return 0
end
local record = redis.call('HMGET', KEYS[1], 'state', 'token')
if record[1] ~= 'processing' or record[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
