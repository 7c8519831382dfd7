-- Sliding-window log: a Sorted Set of admitted request times (ms) per policy, trimmed to the window.
-- Members are '<nonce>:<n>' with a nonce unique per request from the app (Lua's math.random repeats
-- inside Redis), so requests in the same millisecond never collapse. Rejected requests are not
-- recorded: a client retrying while blocked does not extend its block, and the set never holds
-- more than `limit` members inside the window.
-- KEYS, ARGV and reply as every rate-limit script takes them: src/plugins/rate-limit/protocol.ts.
-- ARGV[1] the operation ('c' consume, 'p' peek, 'r' refund), ARGV[2] the nonce
-- KEYS[i]  log of policy i; a refund removes the members added under the nonce, ARGV[2]
-- per policy i, from b = 3 + (i - 1) * 4: ARGV[b] limit, ARGV[b+1] window ms, ARGV[b+2] cost, ARGV[b+3] unused
--          (cost is a whole number >= 1: ZADD takes at least one member, and the app skips a policy
--          for a request that costs nothing)
-- Reply per policy: remaining, reset ms, retry ms, 0; the delay is always 0
-- The common case (one policy, consume, admitted) without tables; anything else falls through to
-- the general path below, which decides afresh (it only finds expired entries trimmed).
-- #include now
if #KEYS == 1 and ARGV[1] == 'c' then
  local key, limit, window, cost = KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  -- Trimmed first, the set holds only the window: ZCARD counts it in O(1).
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  if count + cost <= limit then
    if cost == 1 then
      redis.call('ZADD', key, now, ARGV[2] .. ':1')
    else
      local add = {}
      for n = 1, cost do
        add[#add + 1] = now
        add[#add + 1] = ARGV[2] .. ':' .. n
      end
      redis.call('ZADD', key, unpack(add))
    end
    -- Never shortened: during a rolling deploy an instance with a longer window still counts these.
    if redis.call('PTTL', key) < window then redis.call('PEXPIRE', key, window) end
    local reset = window
    if count > 0 then
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      reset = tonumber(oldest[2]) + window - now
      if reset < 1 then reset = 1 end
    end
    return { 1, 0, limit - count - cost, reset, 0, 0 }
  end
end
-- #include rate-limit-blocks-read
local nonce = ARGV[2]
local reply = { 1, 0 }
local counts = {}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local window, cost = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  if op == 'r' then
    for k = 1, cost do redis.call('ZREM', KEYS[i], nonce .. ':' .. k) end
  else
    counts[i] = redis.call('ZCOUNT', KEYS[i], now - window + 1, '+inf')
    if counts[i] + cost > tonumber(ARGV[b]) then reply[1], over[i] = 0, true end
  end
end
if op == 'r' then return reply end
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local limit, window, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local count = counts[i]
  local retry = 0
  -- A log left without a TTL would never expire: NX repairs it (a consume sets it anyway).
  if reply[1] == 0 or op ~= 'c' then redis.call('PEXPIRE', KEYS[i], window, 'NX') end
  if reply[1] == 1 and op == 'c' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - window)
    local add = {}
    for k = 1, cost do
      add[#add + 1] = now
      add[#add + 1] = nonce .. ':' .. k
    end
    redis.call('ZADD', KEYS[i], unpack(add))
    if redis.call('PTTL', KEYS[i]) < window then redis.call('PEXPIRE', KEYS[i], window) end
    count = count + cost
  elseif count + cost > limit then
    -- Free once enough of the oldest entries leave: the (count + cost - limit)-th oldest in the window.
    local need = math.min(count + cost - limit, count)
    local entry = redis.call('ZRANGEBYSCORE', KEYS[i], now - window + 1, '+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
    retry = window
    if cost <= limit and entry[2] then retry = tonumber(entry[2]) + window - now end
  end
  -- From the oldest unit still in the window (a peek or a rejection trims nothing).
  local reset = window
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[i], now - window + 1, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if oldest[2] then reset = math.max(1, tonumber(oldest[2]) + window - now) end
  reply[#reply + 1] = math.max(0, limit - count)
  reply[#reply + 1] = reset
  reply[#reply + 1] = retry
  reply[#reply + 1] = 0
end
-- #include rate-limit-blocks-apply
return reply
