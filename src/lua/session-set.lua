-- Saves the fields one request changed, only while the session exists and its absolute lifetime
-- has not passed: a request finishing after logout or expiry cannot resurrect the session, and
-- concurrent requests changing different fields keep each other's changes (only the changed fields
-- are written; the session is never read, changed and written back whole).
-- KEYS[1] session hash
-- ARGV[1] idle timeout in ms to slide the expiry by (a touch), or 0 to leave the expiry alone; a
--         session created with its own idle timeout (field __idleTimeoutMs) slides by that one
-- ARGV[2] most bytes the application fields may take together (names plus values), or 0: no bound
-- ARGV[3] n, the number of fields to delete
-- ARGV[4 .. 3 + n] the fields to delete
-- ARGV[4 + n ..] field, value pairs to write
-- Reply: -1 when the session does not exist or its absolute lifetime has passed (it is then
--        deleted); -2 when the writes would take the fields past ARGV[2] (nothing is written);
--        else the new expiry in ms after a touch, 0 without one.
local stamp = redis.call('HGET', KEYS[1], '_absoluteExpiresAt')
if not stamp then
  return -1
end
local absolute = tonumber(stamp)
-- #include now
if now >= absolute then
  redis.call('DEL', KEYS[1])
  return -1
end
local first = 4 + tonumber(ARGV[3])
local bound = tonumber(ARGV[2])
if bound > 0 and #ARGV >= first then
  -- Sized here, not by the caller: concurrent requests may each add fields.
  local all = redis.call('HGETALL', KEYS[1])
  local sizes = {}
  local total = 0
  for i = 1, #all, 2 do
    local name = all[i]
    if name ~= '_principal' and name ~= '_createdAt' and name ~= '_absoluteExpiresAt'
      and name:sub(1, 2) ~= '__' then
      sizes[name] = #name + #all[i + 1]
      total = total + sizes[name]
    end
  end
  for i = 4, first - 1 do
    total = total - (sizes[ARGV[i]] or 0)
    sizes[ARGV[i]] = 0
  end
  for i = first, #ARGV, 2 do
    total = total - (sizes[ARGV[i]] or 0) + #ARGV[i] + #ARGV[i + 1]
    sizes[ARGV[i]] = 0
  end
  if total > bound then
    return -2
  end
end
for i = 4, first - 1 do
  redis.call('HDEL', KEYS[1], ARGV[i])
end
for i = first, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
local expires = 0
if tonumber(ARGV[1]) > 0 then
  local idle = tonumber(redis.call('HGET', KEYS[1], '__idleTimeoutMs') or ARGV[1])
  expires = math.min(now + idle, absolute)
  redis.call('PEXPIREAT', KEYS[1], expires)
end
return expires
