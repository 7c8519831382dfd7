-- Appends a batch of entries to one stream, in order, in one call. The batch comes as one JSON
-- array (a database can build it in the query that produced the entries), so the caller neither
-- parses nor rebuilds an entry: a batch costs it one string and one command whatever its size.
-- KEYS[1] the stream
-- ARGV[1] approximate stream cap (MAXLEN ~); 0: no cap
-- ARGV[2] JSON array of entries, each an array of field/value strings
-- Reply: the ids appended, in order
local entries = cjson.decode(ARGV[2])
local ids = {}
-- Each entry's fields go to XADD as they are (unpack), no table built per entry.
if tonumber(ARGV[1]) > 0 then
  for i = 1, #entries do
    ids[i] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(entries[i]))
  end
else
  for i = 1, #entries do
    ids[i] = redis.call('XADD', KEYS[1], '*', unpack(entries[i]))
  end
end
return ids
