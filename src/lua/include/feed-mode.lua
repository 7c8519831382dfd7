-- A producer's push or pull mode (src/primitives/feed.ts), from its meta hash: `n` its follower
-- count, `src` when the count last came from the application, `pulledAt` when it went above the
-- threshold (0: above it from the start), `pushedAt` when it came back under 90 % of it.

-- Applies a change of mode the count calls for. Returns fanout (a publish fans out now: pushed, or
-- pulled for less than `grace`, while readers learn it is pulled) and byPull (readers read its
-- timeline: pulled, or pushed again for less than `sticky`, so what it published while pulled
-- still shows).
local function producerMode(meta, now, nowText, threshold, grace, sticky)
  local n = tonumber(redis.call('HGET', meta, 'n') or '0')
  local pulledAt = tonumber(redis.call('HGET', meta, 'pulledAt') or '')
  local pushedAt = tonumber(redis.call('HGET', meta, 'pushedAt') or '')
  if pulledAt == nil and n > threshold then
    redis.call('HSET', meta, 'pulledAt', nowText)
    redis.call('HDEL', meta, 'pushedAt')
    pulledAt, pushedAt = now, nil
  elseif pulledAt ~= nil and n * 10 < threshold * 9 then
    redis.call('HDEL', meta, 'pulledAt')
    redis.call('HSET', meta, 'pushedAt', nowText)
    pulledAt, pushedAt = nil, now
  end
  local fanout = pulledAt == nil or now - pulledAt < grace
  local byPull = pulledAt ~= nil or (pushedAt ~= nil and now - pushedAt < sticky)
  return fanout, byPull
end

-- A producer's meta from the application's count: one already above the threshold is pulled from
-- the start, with no grace (no reader can have it as pushed).
local function producerCreate(meta, count, nowText, threshold)
  redis.call('HSET', meta, 'n', count, 'src', nowText)
  if tonumber(count) > threshold then redis.call('HSET', meta, 'pulledAt', '0') end
end
