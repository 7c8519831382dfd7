-- Appends entries to streams, each once per marker, and publishes each appended one: redeliveries
-- of the same source event (at-least-once upstream) land on the stream and the channel exactly
-- once. Several entries, of one stream or of several, in one call: one round trip for a batch.
-- KEYS per entry, in order: its stream, then its marker (same hash tag as the stream; holds the
--   entry's id while it lives)
-- ARGV[1] approximate stream cap (MAXLEN ~); 0: no cap
-- ARGV[2] marker lifetime, ms
-- ARGV[3] stream lifetime, ms; 0: none. Each stream appended to now gets this TTL (PEXPIRE) and
--   loses its entries older than it by the Redis clock (XTRIM MINID ~: whole nodes only)
-- then per entry, in KEYS order: its Pub/Sub channel ('' publishes nothing), its message (a JSON
-- object, published with "id", the new entry's id, put first), its number of field/value arguments
-- n, and those n arguments
-- Reply: per entry {entry id, 1 appended now | 0 the marker existed (the id appended the first time)}
local cap = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
local replies = {}
-- The streams appended to, each once, in order: their TTL and trim come after the appends.
local appended = {}
local streams = {}
local at = 4
for k = 1, #KEYS, 2 do
  local channel = ARGV[at]
  local message = ARGV[at + 1]
  local n = tonumber(ARGV[at + 2])
  local first = at + 3
  at = first + n
  local existing = redis.call('GET', KEYS[k + 1])
  if existing then
    replies[#replies + 1] = {existing, 0}
  else
    -- The entry's fields go to XADD straight from ARGV (unpack of a range), no table built.
    local id
    if cap > 0 then
      id = redis.call('XADD', KEYS[k], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, first, at - 1))
    else
      id = redis.call('XADD', KEYS[k], '*', unpack(ARGV, first, at - 1))
    end
    redis.call('SET', KEYS[k + 1], id, 'PX', ARGV[2])
    if channel ~= '' then
      local rest = string.sub(message, 2)
      if rest ~= '}' then
        rest = ',' .. rest
      end
      redis.call('PUBLISH', channel, '{"id":"' .. id .. '"' .. rest)
    end
    if not appended[KEYS[k]] then
      appended[KEYS[k]] = true
      streams[#streams + 1] = KEYS[k]
    end
    replies[#replies + 1] = {id, 1}
  end
end
-- #include now
if ttl > 0 and #streams > 0 then
  local oldest = now - ttl
  for _, stream in ipairs(streams) do
    redis.call('PEXPIRE', stream, ARGV[3])
    if oldest > 0 then
      redis.call('XTRIM', stream, 'MINID', '~', string.format('%.0f', oldest))
    end
  end
end
return replies
