-- Appends an item to its producer's timeline and tells whether to fan it out (src/primitives/feed.ts).
-- KEYS[1] timeline (sorted set), KEYS[2] meta (hash), KEYS[3] followers (sorted set): one producer's
-- ARGV[1] item id, ARGV[2] at (ms), ARGV[3] timelineMaxItems, ARGV[4] timeline TTL (ms), ARGV[5]
-- now (ms), ARGV[6] pushMaxFollowers, ARGV[7] grace (ms), ARGV[8] sticky (ms), ARGV[9] the follower
-- count from the application ('' none), ARGV[10] how long a count from the application lasts (ms)
-- Reply: -1 the count is missing or due (call again with it), -2 the timeline must be built first
-- (nothing appended), else 1 fan out, 0 not (pulled: the followers set is dropped, fan-out is done);
-- plus 4 when the meta was created here (the feed checks whether it knew this producer before: then
-- its keys were lost, and its followers set with them).
-- #include feed-mode
local now, threshold = tonumber(ARGV[5]), tonumber(ARGV[6])
local exists = redis.call('EXISTS', KEYS[2]) == 1
local created = 0
if ARGV[9] == '' then
  if not exists then return -1 end
  if now - tonumber(redis.call('HGET', KEYS[2], 'src') or '0') >= tonumber(ARGV[10]) then return -1 end
elseif exists then
  redis.call('HSET', KEYS[2], 'n', ARGV[9], 'src', ARGV[5])
else
  producerCreate(KEYS[2], ARGV[9], ARGV[5], threshold)
  created = 4
end
if redis.call('EXISTS', KEYS[1]) == 0 then return created - 2 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local fanout = producerMode(KEYS[2], now, ARGV[5], threshold, tonumber(ARGV[7]), tonumber(ARGV[8]))
if not fanout then redis.call('UNLINK', KEYS[3]) end
return created + (fanout and 1 or 0)
