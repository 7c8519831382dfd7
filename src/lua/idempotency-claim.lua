-- Claims an Idempotency-Key record, or reports what the request must get instead. One script so
-- that two requests with one key can never both see the record absent (or both take over a lease).
-- KEYS[1] the record: a Hash (state, fp, token, leaseUntil) while processing; once done, the String
--         packed by idempotency-complete.lua (a Hash with state 'done', fp, status, headers, body
--         and kept when an earlier version completed it: read alike until it expires)
-- ARGV[1] request fingerprint, ARGV[2] new owner token, ARGV[3] lease in ms, ARGV[4] retention in ms
-- Reply: { 'new' } record created, the caller owns it
--        { 'takeover' } a processing record whose lease had expired now belongs to the caller
--        { 'mismatch' } the key was used with another fingerprint (checked before in-flight)
--        { 'conflict', lease_remaining_ms } another owner holds a live lease
--        { 'replay', status, headers_json, body, kept } the stored response
-- #include now
local lease = tonumber(ARGV[3])
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  redis.call('HSET', KEYS[1], 'state', 'processing', 'fp', ARGV[1], 'token', ARGV[2], 'leaseUntil', now + lease)
  -- The retention, not the lease, bounds the record: a crashed owner's key still rejects another
  -- payload, and the short lease (not the TTL) decides when a retry may take over.
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return { 'new' }
end
if kind == 'string' then
  -- Packed by idempotency-complete.lua: the fingerprint's first 22 characters, the status (three
  -- digits), kept ('1' or '0'), the headers as JSON (never a raw newline), a newline, the body.
  local packed = redis.call('GET', KEYS[1])
  if string.sub(packed, 1, 22) ~= string.sub(ARGV[1], 1, 22) then
    return { 'mismatch' }
  end
  local newline = string.find(packed, '\n', 27, true)
  return {
    'replay',
    string.sub(packed, 23, 25),
    string.sub(packed, 27, newline - 1),
    string.sub(packed, newline + 1),
    string.sub(packed, 26, 26),
  }
end
local record = redis.call('HMGET', KEYS[1], 'state', 'fp', 'leaseUntil', 'status', 'headers', 'body', 'kept')
if record[2] ~= ARGV[1] then
  return { 'mismatch' }
end
if record[1] == 'done' then
  return { 'replay', record[4], record[5], record[6], record[7] }
end
local remaining = tonumber(record[3]) - now
if remaining > 0 then
  return { 'conflict', remaining }
end
redis.call('HSET', KEYS[1], 'token', ARGV[2], 'leaseUntil', now + lease)
return { 'takeover' }
