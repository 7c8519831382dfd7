-- Reads one cache entry and, when it must be (re)loaded, tries to take the fill lease.
-- KEYS[1] value: "<softExpiresAtMs>|<loadMs>|<payload>", hard TTL on the key; a tagged entry
--         is "#<tags>|<softExpiresAtMs>|<loadMs>|<payload>", <tags> = "tag=generation,..." as
--         recorded when it was filled (the tags' generations live in other slots)
-- KEYS[2] generation token, replaced by every invalidation (the fence)
-- KEYS[3] lease: the owner token of the one caller allowed to load and fill
-- ARGV[1] lease owner token       ARGV[2] lease TTL ms
-- ARGV[3] XFetch beta (0: no early refresh)   ARGV[4] a random number in (0, 1]
-- ARGV[5] generation TTL ms       ARGV[6] a fresh generation token, used when KEYS[2] is absent
-- ARGV[7] optional: the current "tag=generation,..." of the caller's tags; an entry that recorded
--         anything else is treated as absent. Without it a tagged entry is answered as stored and
--         the caller checks the generations it recorded (the reply's 4th element).
-- Reply: { state, payload, generation[, tags] } with tags present only for a tagged entry, and state
--   'fresh'   payload is fresh; nothing to do
--   'early'   payload is fresh, XFetch chose this caller to refresh it early: it holds the lease
--   'refresh' payload is past its soft TTL and this caller holds the lease: serve it, refresh it
--   'stale'   payload is past its soft TTL, another caller is refreshing it: serve it
--   'load'    no value; this caller holds the lease: load, then fill with `generation`
--   'wait'    no value; another caller holds the lease
-- #include now
local raw = redis.call('GET', KEYS[1])
local payload = ''
local soft = false
local tags = nil
local start = 1
if raw and string.byte(raw, 1) == 35 then
  start = string.find(raw, '|', 2, true) + 1
  tags = string.sub(raw, 2, start - 2)
end
if raw and ARGV[7] and ARGV[7] ~= (tags or '') then
  raw = false
end
if raw then
  local a = string.find(raw, '|', start, true)
  local b = string.find(raw, '|', a + 1, true)
  local softAt = tonumber(string.sub(raw, start, a - 1))
  local loadMs = tonumber(string.sub(raw, a + 1, b - 1))
  payload = string.sub(raw, b + 1)
  soft = now >= softAt
  local beta = tonumber(ARGV[3])
  -- XFetch (Vattani et al.): refresh early with a probability that grows as expiry nears,
  -- scaled by how long a load takes. ln(rand) <= 0, so the left side is now or later.
  local early = beta > 0 and now - loadMs * beta * math.log(tonumber(ARGV[4])) >= softAt
  if not soft and not early then
    return { 'fresh', payload, '', tags }
  end
end
local generation = redis.call('GET', KEYS[2])
if not generation then
  generation = ARGV[6]
  redis.call('SET', KEYS[2], generation, 'PX', ARGV[5])
end
local leased = redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2])
if raw then
  if leased then
    return { soft and 'refresh' or 'early', payload, generation, tags }
  end
  return { soft and 'stale' or 'fresh', payload, generation, tags }
end
return { leased and 'load' or 'wait', '', generation }
