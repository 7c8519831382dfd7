-- Says this instance is alive: its heartbeat key, with a TTL, and its entry in the registry.
-- KEYS[1] this instance's heartbeat (string with a TTL), KEYS[2] the instance registry (set)
-- ARGV[1] heartbeat ttl in ms, ARGV[2] this instance's id
-- Reply: 1
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
