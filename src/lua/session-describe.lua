-- Describes one session for its principal's listing ("devices"), from one key.
-- KEYS[1] session hash
-- ARGV none
-- Reply: false when the session does not exist or its absolute lifetime has passed (it is then
--        deleted); else { principal, created_at_ms, absolute_expires_at_ms, idle_timeout_ms or '',
--        expires_at_ms } with the expiry read from the key's TTL on the Redis clock.
local fields = redis.call('HMGET', KEYS[1], '_principal', '_createdAt', '_absoluteExpiresAt', '__idleTimeoutMs')
if not fields[3] then
  return false
end
-- #include now
local absolute = tonumber(fields[3])
if now >= absolute then
  redis.call('DEL', KEYS[1])
  return false
end
local ttl = redis.call('PTTL', KEYS[1])
local expires = absolute
if ttl >= 0 then
  expires = math.min(now + ttl, absolute)
end
return { fields[1], fields[2], fields[3], fields[4] or '', expires }
