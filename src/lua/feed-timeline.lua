-- Producers' timelines (src/primitives/feed.ts): a page of each, or one's build from the application.
-- KEYS the timelines (sorted sets: item id -> at; placeholder '' at -2 while built, -1 once built),
-- all in one hash slot; 'start' and 'finish' take one, KEYS[1]
-- ARGV[1] 'range', ARGV[2] cursor at ('' from the newest), ARGV[3] cursor id, ARGV[4] k. Reply per
--   timeline {0} missing or being built (build it), else {1, exhausted (0/1), {id, at, ...}}.
-- ARGV[1] 'start', ARGV[2] TTL (ms): creates it with the placeholder at -2 unless it exists, so
--   publishes land in it while the application is asked. Reply 1.
-- ARGV[1] 'finish', ARGV[2] TTL (ms), ARGV[3] timelineMaxItems, then at, id pairs: adds them and
--   marks it built. Reply 0 when it vanished since 'start' (build again), else 1.
-- #include feed-range
local op = ARGV[1]
if op == 'range' then
  local out = {}
  for i, key in ipairs(KEYS) do
    local placeholder = redis.call('ZSCORE', key, '')
    -- No placeholder: trimmed off a full timeline, or no timeline at all.
    if (placeholder and tonumber(placeholder) == -2) or (not placeholder and redis.call('EXISTS', key) == 0) then
      out[i] = {0}
    else
      local items, exhausted = feedRange(key, ARGV[2], ARGV[3], tonumber(ARGV[4]), nil, 1)
      out[i] = {1, exhausted and 1 or 0, items}
    end
  end
  return out
end
if op == 'start' then
  if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('ZADD', KEYS[1], -2, '') end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 4, #ARGV, 1000 do
  redis.call('ZADD', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('ZADD', KEYS[1], -1, '')
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
