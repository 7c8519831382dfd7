-- A reader's keys (src/primitives/feed.ts), one hash tag: KEYS[1] its feed (sorted set), KEYS[2]
-- the producers it follows (set), KEYS[3] those of them read by pull (set), KEYS[4] its meta (hash:
-- `mark`, its last activity mark in ms).

-- Built: the feed exists, is not being built (its placeholder '' at -2) and the reader has a mark.
local function readerBuilt()
  if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[4], 'mark') == 0 then return false end
  local placeholder = redis.call('ZSCORE', KEYS[1], '')
  return not (placeholder and tonumber(placeholder) == -2)
end

-- Gives `key` the feed's expiry: a set a first SADD creates would otherwise never expire.
local function readerSameExpiry(key)
  local at = redis.call('PEXPIRETIME', KEYS[1])
  if at > 0 then redis.call('PEXPIREAT', key, at) end
end

-- SADD (or ZADD with score, member pairs) of list[from..to], in calls of at most 1000 arguments.
local function readerAddAll(command, key, list, from, to)
  local step = 1000
  for i = from, to, step do
    redis.call(command, key, unpack(list, i, math.min(i + step - 1, to)))
  end
end
