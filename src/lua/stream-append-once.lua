-- Appends entries to one stream, each once per marker, and publishes each appended one:
-- redeliveries of the same source event (at-least-once upstream) land on the stream and the
-- channel exactly once. Several entries in one call: one round trip for a batch.
-- KEYS[1] the stream
-- KEYS[2..] one marker per entry (same hash tag as the stream); holds the entry's id while it lives
-- ARGV[1] approximate stream cap (MAXLEN ~); 0: no cap
-- ARGV[2] marker lifetime, ms
-- ARGV[3] Pub/Sub channel ('' publishes nothing)
-- then per entry, in KEYS order: its message (a JSON object, published with "id", the new entry's
-- id, put first), its number of field/value arguments n, and those n arguments
-- Reply: per entry {entry id, 1 appended now | 0 the marker existed (the id appended the first time)}
local cap = tonumber(ARGV[1])
local replies = {}
local at = 4
for k = 2, #KEYS do
  local message = ARGV[at]
  local n = tonumber(ARGV[at + 1])
  local first = at + 2
  at = first + n
  local existing = redis.call('GET', KEYS[k])
  if existing then
    replies[#replies + 1] = {existing, 0}
  else
    local xadd = {'XADD', KEYS[1]}
    if cap > 0 then
      xadd[#xadd + 1] = 'MAXLEN'
      xadd[#xadd + 1] = '~'
      xadd[#xadd + 1] = ARGV[1]
    end
    xadd[#xadd + 1] = '*'
    for i = first, first + n - 1 do
      xadd[#xadd + 1] = ARGV[i]
    end
    local id = redis.call(unpack(xadd))
    redis.call('SET', KEYS[k], id, 'PX', ARGV[2])
    if ARGV[3] ~= '' then
      local rest = string.sub(message, 2)
      if rest ~= '}' then
        rest = ',' .. rest
      end
      redis.call('PUBLISH', ARGV[3], '{"id":"' .. id .. '"' .. rest)
    end
    replies[#replies + 1] = {id, 1}
  end
end
return replies
