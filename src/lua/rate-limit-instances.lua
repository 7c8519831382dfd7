-- Buffered rate limiting: this instance says it is alive (or that it leaves), and learns how many
-- instances share the key prefix, which divides the quota each one leases. Entries are scored by
-- their expiry on the Redis clock, so a crashed instance stops counting once its last heartbeat
-- expires. Its entry is removed when an instance joins or leaves (a crashed one comes back as a
-- join), not on every heartbeat: a renewal is TIME, ZADD, ZCOUNT and PEXPIRE.
-- KEYS[1] the live instances of the key prefix (sorted set: instance id -> expiry ms)
-- ARGV[1] this instance's id, ARGV[2] heartbeat ttl in ms (0: this instance leaves)
-- Reply: the number of live instances, this one included unless it left
-- #include now
local ttl = tonumber(ARGV[2])
local changed
if ttl > 0 then
  changed = redis.call('ZADD', KEYS[1], now + ttl, ARGV[1]) == 1
else
  changed = redis.call('ZREM', KEYS[1], ARGV[1]) == 1
end
if changed then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
-- A leave keeps the others' expiry: shortened, the set would vanish before their next heartbeat.
if live > 0 and ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl * 2) end
return live
