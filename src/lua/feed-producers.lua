-- One reader's follows, unfollows and activity marks on producers of one hash slot
-- (src/primitives/feed.ts): each producer's follower count, mode, and the reader in its followers set.
-- KEYS: per producer its meta (hash) then its followers (sorted set: reader -> activity mark)
-- ARGV[1] reader, ARGV[2] the reader's activity mark for the followers sets ('' to leave them; '-'
-- for a follow or unfollow of a reader whose feed is not built: Redis cannot tell a retry from a
-- new follow there, so the count is not moved but marked due, and the next publish asks the
-- application),
-- ARGV[3] now (ms), ARGV[4] pushMaxFollowers, ARGV[5] grace (ms), ARGV[6] sticky (ms), then per
-- producer: delta (1 follow, -1 unfollow, 0 mark) and its follower count from the application
-- ('' when not known; a known count already holds this follow)
-- Reply: per producer, -1 when its meta is missing and no count came (nothing done but an
-- unfollow's ZREM), else 2 * fanout + byPull (see feed-mode), plus 4 when its meta was created here
-- #include feed-mode
local reader, mark, nowText = ARGV[1], ARGV[2], ARGV[3]
local due = mark == '-'
local now, threshold, grace, sticky = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
for i = 1, #KEYS / 2 do
  local meta, followers = KEYS[2 * i - 1], KEYS[2 * i]
  local delta, count = tonumber(ARGV[5 + 2 * i]), ARGV[6 + 2 * i]
  local exists = redis.call('EXISTS', meta) == 1
  if not exists and count == '' then
    if delta < 0 then redis.call('ZREM', followers, reader) end
    out[i] = -1
  else
    local created = 0
    if not exists then
      producerCreate(meta, count, nowText, threshold)
      created = 4
    elseif due then
      redis.call('HSET', meta, 'src', 0)
    elseif delta ~= 0 and redis.call('HINCRBY', meta, 'n', delta) < 0 then
      redis.call('HSET', meta, 'n', 0)
    end
    local fanout, byPull = producerMode(meta, now, nowText, threshold, grace, sticky)
    if delta < 0 then
      redis.call('ZREM', followers, reader)
    elseif mark ~= '' and not due and fanout then
      redis.call('ZADD', followers, mark, reader)
    end
    out[i] = created + (fanout and 2 or 0) + (byPull and 1 or 0)
  end
end
return out
