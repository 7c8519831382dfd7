-- The followers a fan-out job writes to (src/primitives/feed.ts): those active within the window,
-- copied to a snapshot the job pages through by rank (marks and follows during the job cannot shift
-- it); followers inactive longer than the window are dropped from the set (their feeds expired).
-- KEYS[1] followers (sorted set: reader -> activity mark), KEYS[2] the job's snapshot: one producer's
-- ARGV[1] the oldest mark still active (ms), ARGV[2] the snapshot's TTL (ms)
-- Reply: how many followers the snapshot holds
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1])
local n = redis.call('ZRANGESTORE', KEYS[2], KEYS[1], ARGV[1], '+inf', 'BYSCORE')
if n > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return n
