-- Stores the final response of a processing record, only for the owner's token: a request whose
-- lease was taken over cannot overwrite the new owner's record.
-- KEYS[1] record: the processing Hash becomes one String. A Hash holding a body over 64 bytes
--         (hash-max-listpack-value) is a full hashtable of about 730 bytes; the String holding the
--         same response is under 300.
-- ARGV[1] owner token, ARGV[2] status (three digits), ARGV[3] replayable headers as JSON (no raw
-- newline), ARGV[4] body, ARGV[5] '1' when the body is kept, '0' when it exceeded the size cap,
-- ARGV[6] retention in ms
-- Reply: 1 when stored, 0 when the caller no longer owns the record
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return 0
end
local record = redis.call('HMGET', KEYS[1], 'state', 'token', 'fp')
if record[1] ~= 'processing' or record[2] ~= ARGV[1] then
  return 0
end
-- Read back by idempotency-claim.lua, which finds each part by position. 22 base64url characters
-- are 132 bits of the SHA-256 fingerprint: enough to tell a retry from another request under the
-- same key (two requests of one caller colliding would only replay that caller's own answer), and
-- 21 bytes less keep a transfer's record under 300 bytes in a Cluster too (whose keys cost 16 more).
redis.call('SET', KEYS[1], string.sub(record[3], 1, 22) .. ARGV[2] .. ARGV[5] .. ARGV[3] .. '\n' .. ARGV[4], 'PX', ARGV[6])
return 1
