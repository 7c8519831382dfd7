-- Which of a page's items their producers removed (src/primitives/feed.ts): the read's check of the
-- feed's copies against each producer's deleted set.
-- KEYS per producer its deleted set (sorted set: item id -> at) then its meta (hash), all in one
-- hash slot
-- ARGV per producer: n, then n item ids of that producer
-- Reply: {the ids found removed, producers whose meta is missing}. An item in a feed means its
-- producer's meta was written (a publish, a follow or a build); missing now, the producer's keys
-- were lost, its deleted set with them.
local removed = {}
local lost = 0
local at = 1
for p = 1, #KEYS / 2 do
  local key = KEYS[2 * p - 1]
  if redis.call('EXISTS', KEYS[2 * p]) == 0 then lost = lost + 1 end
  local n = tonumber(ARGV[at])
  if n > 0 and redis.call('EXISTS', key) == 1 then
    local scores = redis.call('ZMSCORE', key, unpack(ARGV, at + 1, at + n))
    for i = 1, n do
      if scores[i] then removed[#removed + 1] = ARGV[at + i] end
    end
  end
  at = at + n + 1
end
return {removed, lost}
