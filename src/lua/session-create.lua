-- Creates a session hash with its absolute and idle expiry, stamped with the Redis clock.
-- KEYS[1] new session hash (fails if it already exists: ids are 256-bit random, so that is a bug)
-- ARGV[1] idle timeout in ms, ARGV[2] absolute lifetime in ms, ARGV[3] principal ('' for an
-- anonymous session),
-- ARGV[4..] field, value pairs of initial data
-- Reply: { created_at_ms, expires_at_ms, absolute_expires_at_ms }
-- #include now
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('session id collision')
end
local absolute = now + tonumber(ARGV[2])
local expires = math.min(now + tonumber(ARGV[1]), absolute)
redis.call('HSET', KEYS[1], '_principal', ARGV[3], '_createdAt', now, '_absoluteExpiresAt', absolute)
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIREAT', KEYS[1], expires)
return { now, expires, absolute }
