-- Rebuilds a reader's feed by pull (src/primitives/feed.ts): 'start' before asking the application,
-- 'finish' with what it answered.
-- KEYS[1] feed (sorted set), KEYS[2] following (set), KEYS[3] pulled (set), KEYS[4] meta (hash): one reader's
-- ARGV[1] 'start', ARGV[2] expiry (unix ms), ARGV[3] this build's token: the feed exists from now
--   on, emptied, with its placeholder '' at -2 (being built), so fan-out writes land in it while the
--   application is asked; following, pulled and the mark are cleared; the token is kept in meta
--   (`build`), where a follow or unfollow, or a later build, replaces or drops it. Reply 1.
-- ARGV[1] 'finish', ARGV[2] expiry (unix ms), ARGV[3] the activity mark (ms), ARGV[4] feedMaxItems,
--   ARGV[5] the build's token, ARGV[6] the loss token read before 'start', ARGV[7] n, then n
--   producers followed, then m, then m producers read by pull, then score, member pairs of items.
--   Reply 0 when the feed vanished since 'start' or the token is no longer in meta (a follow or
--   unfollow came in while the application was asked, whose answer may predate it: build again),
--   2 when another build finished it meanwhile, else 1.
-- #include feed-reader
if ARGV[1] == 'start' then
  -- What the feed held goes: a feed rebuilt after a producer's keys were lost may hold items that
  -- producer removed since. Fan-out before this point was of items the application's answer holds.
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  redis.call('ZADD', KEYS[1], -2, '')
  redis.call('HDEL', KEYS[4], 'mark')
  redis.call('HSET', KEYS[4], 'build', ARGV[3])
  redis.call('PEXPIREAT', KEYS[1], ARGV[2])
  redis.call('PEXPIREAT', KEYS[4], ARGV[2])
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[4], 'build') ~= ARGV[5] then
  -- Built meanwhile by a build started later (another process), which no change voided: done.
  if readerBuilt() then return 2 end
  return 0
end
local following = tonumber(ARGV[7])
local pulledAt = 8 + following
local pulled = tonumber(ARGV[pulledAt])
local itemsAt = pulledAt + pulled + 1
if following > 0 then readerAddAll('SADD', KEYS[2], ARGV, 8, 7 + following) end
if pulled > 0 then readerAddAll('SADD', KEYS[3], ARGV, pulledAt + 1, pulledAt + pulled) end
if itemsAt < #ARGV then readerAddAll('ZADD', KEYS[1], ARGV, itemsAt, #ARGV) end
redis.call('ZADD', KEYS[1], -1, '')
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
redis.call('HDEL', KEYS[4], 'build')
redis.call('HSET', KEYS[4], 'mark', ARGV[3], 'losses', ARGV[6])
for i = 1, 4 do redis.call('PEXPIREAT', KEYS[i], ARGV[2]) end
return 1
