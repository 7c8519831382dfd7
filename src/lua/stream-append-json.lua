-- Appends a batch of entries to one stream, in order, in one call. The batch comes as one JSON
-- array (a database can build it in the query that produced the entries), so the caller neither
-- parses nor rebuilds an entry: a batch costs it one string and one command whatever its size.
-- KEYS[1] the stream
-- ARGV[1] approximate stream cap (MAXLEN ~); 0: no cap
-- ARGV[2] JSON array of entries, each an array of field/value strings
-- Reply: the ids appended, in order
local entries = cjson.decode(ARGV[2])
local head = {'XADD', KEYS[1]}
if tonumber(ARGV[1]) > 0 then
  head = {'XADD', KEYS[1], 'MAXLEN', '~', ARGV[1]}
end
head[#head + 1] = '*'
local ids = {}
for i = 1, #entries do
  local xadd = {unpack(head)}
  local fields = entries[i]
  for j = 1, #fields do
    xadd[#xadd + 1] = fields[j]
  end
  ids[i] = redis.call(unpack(xadd))
end
return ids
