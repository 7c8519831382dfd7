-- Loads a session and slides its idle expiry with a TTL-only touch (the hash is not rewritten).
-- KEYS[1] session hash
-- ARGV[1] idle timeout in ms
-- Reply: nil when the session does not exist or its absolute lifetime has passed (it is then
--        deleted); else { now_ms, expires_at_ms, field1, value1, ... } where expires_at_ms is
--        the sooner of now + idle and the absolute expiry.
-- One HGETALL serves both the expiry check and the reply: this runs on every request.
local fields = redis.call('HGETALL', KEYS[1])
local absolute
for i = 1, #fields, 2 do
  if fields[i] == '_absoluteExpiresAt' then
    absolute = tonumber(fields[i + 1])
    break
  end
end
if not absolute then
  return nil
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= absolute then
  redis.call('DEL', KEYS[1])
  return nil
end
local expires = math.min(now + tonumber(ARGV[1]), absolute)
redis.call('PEXPIREAT', KEYS[1], expires)
local reply = { now, expires }
for i = 1, #fields do
  reply[i + 2] = fields[i]
end
return reply
