-- Adopts (part of) a registered instance whose heartbeat is gone: its delayed ids into the
-- adopter's delayed set with their due times, its processing ids back to ready. Each call checks
-- the heartbeat again, so an instance that came back is left alone; a batch per call keeps Redis
-- responsive, and the orphan is unregistered by the call that empties it.
-- KEYS[1] orphan's heartbeat, KEYS[2] orphan's delayed set, KEYS[3] orphan's processing list,
-- KEYS[4] orphan's take times, KEYS[5] adopter's delayed set, KEYS[6] the ready list,
-- KEYS[7] the instance registry
-- ARGV[1] orphan's id, ARGV[2] at most this many ids of each kind, ARGV[3] adopter's id
-- Reply: { status, adopted } status -1 the orphan is alive (nothing done), 0 more to adopt,
--        1 the orphan is empty and unregistered; adopted = delayed ids moved + entries returned
if redis.call('EXISTS', KEYS[1]) == 1 then
  return { -1, 0 }
end
local batch = tonumber(ARGV[2])
local adopted = 0
local delayed = redis.call('ZRANGE', KEYS[2], 0, batch - 1, 'WITHSCORES')
if #delayed > 0 then
  redis.call('SADD', KEYS[7], ARGV[3])
  local members = {}
  for i = 1, #delayed, 2 do
    -- LT: an id the adopter also holds keeps the earlier due time (never postponed).
    redis.call('ZADD', KEYS[5], 'LT', delayed[i + 1], delayed[i])
    members[#members + 1] = delayed[i]
  end
  redis.call('ZREM', KEYS[2], unpack(members))
  adopted = adopted + #members
end
for _ = 1, batch do
  if not redis.call('LMOVE', KEYS[3], KEYS[6], 'LEFT', 'RIGHT') then
    break
  end
  adopted = adopted + 1
end
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[4])
  redis.call('SREM', KEYS[7], ARGV[1])
  return { 1, adopted }
end
return { 0, adopted }
