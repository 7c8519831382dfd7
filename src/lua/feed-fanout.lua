-- Writes one item into readers' feeds (src/primitives/feed.ts, fan-out): only into feeds that
-- exist (a missing feed is rebuilt by pull when its reader returns, and a feed holding one item
-- would look built), each capped to its newest items. The feeds' expiry is left alone: it follows
-- the reader's activity mark, so a feed never outlives the window fan-out reaches it in.
-- KEYS: the feeds (sorted sets), all in one hash slot
-- ARGV[1] feedMaxItems, ARGV[2] the item's at (ms), ARGV[3] its member ('<id> <producer>')
-- Reply: {feeds the item was added to, feeds missing (skipped)}
local cap = tonumber(ARGV[1])
local added, missing = 0, 0
for _, feed in ipairs(KEYS) do
  if redis.call('EXISTS', feed) == 1 then
    added = added + redis.call('ZADD', feed, ARGV[2], ARGV[3])
    if redis.call('ZCARD', feed) > cap then redis.call('ZREMRANGEBYRANK', feed, 0, -(cap + 1)) end
  else
    missing = missing + 1
  end
end
return {added, missing}
