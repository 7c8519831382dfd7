-- Writes fields of an existing session only: a slow request finishing after logout cannot
-- resurrect the session, and concurrent requests writing different fields do not overwrite
-- each other (no read-modify-write of the whole session).
-- KEYS[1] session hash
-- ARGV field, value pairs; an empty value deletes the field
-- Reply: 1 when written, 0 when the session no longer exists
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 1, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 1
