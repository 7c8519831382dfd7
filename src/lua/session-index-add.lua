-- Records a session id in its principal's index (for "log out everywhere"). The index lives as
-- long as its longest-lived session could; ids of expired sessions are pruned by the caller.
-- KEYS[1] index set of the principal
-- ARGV[1] session id to add, ARGV[2] absolute lifetime in ms
-- Reply: number of ids in the index
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return redis.call('SCARD', KEYS[1])
