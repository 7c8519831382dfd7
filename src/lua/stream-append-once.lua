-- Appends one entry to a stream once per marker, and publishes it: redeliveries of the same
-- source event (at-least-once upstream) land on the stream and the channel exactly once.
-- KEYS[1] the stream
-- KEYS[2] the marker (same hash tag as the stream); holds the entry's id while it lives
-- ARGV[1] approximate stream cap (MAXLEN ~); 0: no cap
-- ARGV[2] marker lifetime, ms
-- ARGV[3] Pub/Sub channel ('' publishes nothing)
-- ARGV[4] message, a JSON object: published with "id" (the new entry's id) put first
-- ARGV[5..] the entry's field/value pairs
-- Reply: {entry id, 1 appended now | 0 the marker existed (the id appended the first time)}
local existing = redis.call('GET', KEYS[2])
if existing then
  return {existing, 0}
end
local xadd = {'XADD', KEYS[1]}
if tonumber(ARGV[1]) > 0 then
  table.insert(xadd, 'MAXLEN')
  table.insert(xadd, '~')
  table.insert(xadd, ARGV[1])
end
table.insert(xadd, '*')
for i = 5, #ARGV do
  table.insert(xadd, ARGV[i])
end
local id = redis.call(unpack(xadd))
redis.call('SET', KEYS[2], id, 'PX', ARGV[2])
if ARGV[3] ~= '' then
  local rest = string.sub(ARGV[4], 2)
  if rest ~= '}' then
    rest = ',' .. rest
  end
  redis.call('PUBLISH', ARGV[3], '{"id":"' .. id .. '"' .. rest)
end
return {id, 1}
