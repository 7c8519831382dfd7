-- Stores the final response of a processing record, only for the owner's token: a request whose
-- lease was taken over cannot overwrite the new owner's record.
-- KEYS[1] record hash
-- ARGV[1] owner token, ARGV[2] status, ARGV[3] replayable headers as JSON, ARGV[4] body,
-- ARGV[5] '1' when the body is kept, '0' when it exceeded the size cap, ARGV[6] retention in ms
-- Reply: 1 when stored, 0 when the caller no longer owns the record
local record = redis.call('HMGET', KEYS[1], 'state', 'token')
if record[1] ~= 'processing' or record[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4], 'kept', ARGV[5])
redis.call('HDEL', KEYS[1], 'token', 'leaseUntil')
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
