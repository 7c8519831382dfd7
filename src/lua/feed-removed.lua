-- Which of a page's items their producers removed (src/primitives/feed.ts): the read's check of the
-- feed's copies against each producer's deleted set.
-- KEYS the deleted sets (sorted sets: item id -> at) of the page's producers, all in one hash slot
-- ARGV per key: n, then n item ids of that producer
-- Reply: the ids found removed
local removed = {}
local at = 1
for _, key in ipairs(KEYS) do
  local n = tonumber(ARGV[at])
  if n > 0 and redis.call('EXISTS', key) == 1 then
    local scores = redis.call('ZMSCORE', key, unpack(ARGV, at + 1, at + n))
    for i = 1, n do
      if scores[i] then removed[#removed + 1] = ARGV[at + i] end
    end
  end
  at = at + n + 1
end
return removed
