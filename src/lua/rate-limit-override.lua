-- Rate-limit overrides: sets or removes one override (a policy's limit for one key until it
-- expires), drops the expired ones, records the change in the audit stream and announces it.
-- KEYS[1] entries (hash: policy "\n" key -> the override as JSON)
-- KEYS[2] expiry (sorted set: the same fields -> expiry ms on the Redis clock)
-- KEYS[3] version (a random token replaced by every change; instances compare it on their polls)
-- KEYS[4] audit (stream of the changes, capped)
-- ARGV[1] 'set' or 'remove', ARGV[2] policy, ARGV[3] key, ARGV[4] limit (set), ARGV[5] ttl ms (set),
-- ARGV[6] reason, ARGV[7] by, ARGV[8] most overrides kept, ARGV[9] audit entries kept (about),
-- ARGV[10] the channel the new version is published on, ARGV[11] the new version (a random token)
-- Reply: JSON { version, existed, override } ({ full = true } for a new override past ARGV[8])
-- #include now
local field = ARGV[2] .. '\n' .. ARGV[3]
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for i = 1, #expired, 1000 do
  redis.call('HDEL', KEYS[1], unpack(expired, i, math.min(i + 999, #expired)))
end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
local reply = {}
if ARGV[1] == 'set' then
  if redis.call('HEXISTS', KEYS[1], field) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[8]) then
    return cjson.encode({ full = true })
  end
  local expiresAt = now + tonumber(ARGV[5])
  reply.override = {
    policy = ARGV[2], key = ARGV[3], limit = tonumber(ARGV[4]), expiresAt = expiresAt, setAt = now,
    reason = ARGV[6], by = ARGV[7],
  }
  reply.existed = redis.call('HSET', KEYS[1], field, cjson.encode(reply.override)) == 0
  redis.call('ZADD', KEYS[2], expiresAt, field)
else
  reply.existed = redis.call('HDEL', KEYS[1], field) == 1
  redis.call('ZREM', KEYS[2], field)
end
-- A new token, never a count: a count lost with the data (a flush, a restart) would start again and
-- could come back to the value an instance loaded before the loss, hiding the change from its poll.
reply.version = ARGV[11]
-- The entries live until their latest expiry; they and the version a day longer, so that a poll
-- after the last expiry still finds the version it knows.
local keep = 86400000
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if #last > 0 then
  keep = keep + math.max(0, tonumber(last[2]) - now)
  redis.call('PEXPIRE', KEYS[1], keep)
  redis.call('PEXPIRE', KEYS[2], keep)
end
redis.call('SET', KEYS[3], ARGV[11], 'PX', keep)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*', 'action', ARGV[1], 'policy', ARGV[2], 'key', ARGV[3],
  'limit', ARGV[4], 'ttlMs', ARGV[5], 'reason', ARGV[6], 'by', ARGV[7])
redis.call('PEXPIRE', KEYS[4], 30 * 86400000)
redis.call('PUBLISH', ARGV[10], reply.version)
return cjson.encode(reply)
