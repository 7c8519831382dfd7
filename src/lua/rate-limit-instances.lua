-- Buffered rate limiting: this instance says it is alive (or that it leaves), and learns how many
-- instances share the key prefix, which divides the quota each one leases. Entries are scored by
-- their expiry on the Redis clock, so a crashed instance drops out once its last heartbeat expires.
-- KEYS[1] the live instances of the key prefix (sorted set: instance id -> expiry ms)
-- ARGV[1] this instance's id, ARGV[2] heartbeat ttl in ms (0: this instance leaves)
-- Reply: the number of live instances, this one included unless it left
-- #include now
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZCARD', KEYS[1])
if live > 0 then redis.call('PEXPIRE', KEYS[1], math.max(ttl, 1000) * 2) end
return live
