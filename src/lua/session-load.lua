-- Loads a session and slides its idle expiry with a TTL-only touch (the hash is not rewritten).
-- KEYS[1] session hash
-- ARGV[1] idle timeout in ms
-- Reply: nil when the session does not exist or its absolute lifetime has passed (it is then
--        deleted); else { now_ms, expires_at_ms, field1, value1, ... } where expires_at_ms is
--        the sooner of now + idle and the absolute expiry.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local absolute = tonumber(redis.call('HGET', KEYS[1], '_absoluteExpiresAt'))
if not absolute then
  return nil
end
if now >= absolute then
  redis.call('DEL', KEYS[1])
  return nil
end
local expires = math.min(now + tonumber(ARGV[1]), absolute)
redis.call('PEXPIREAT', KEYS[1], expires)
local reply = { now, expires }
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields do
  reply[#reply + 1] = fields[i]
end
return reply
