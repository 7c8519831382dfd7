-- Sliding-window counter: the current and previous fixed windows of each policy in one Hash
-- (w = current window index, c = its count, p = previous window's count); the estimate weights the
-- previous window by how much of it the sliding window still covers. O(1) memory per key.
-- KEYS, ARGV and reply as every rate-limit script takes them: src/plugins/rate-limit/protocol.ts.
-- ARGV[1] the operation ('c' consume, 'p' peek, 'r' refund), ARGV[2] the nonce
-- KEYS[i]  Hash of policy i; the nonce is unused here
-- per policy i, from b = 3 + (i - 1) * 4: ARGV[b] limit, ARGV[b+1] window ms, ARGV[b+2] cost,
--          ARGV[b+3] window index of the consume being refunded (op 'r' only)
-- Reply per policy: remaining, reset ms, retry ms, window index (the refund's window); the delay is always 0
-- The common case (one policy, consume, admitted) without tables; anything else falls through to
-- the general path below, which decides afresh (nothing has been written yet).
-- #include now
if #KEYS == 1 and ARGV[1] == 'c' then
  local limit, window, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local idx = math.floor(now / window)
  local elapsed = now - idx * window
  local h = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
  local w, c, p = tonumber(h[1]), tonumber(h[2]) or 0, tonumber(h[3]) or 0
  if w == nil or w < idx - 1 then
    c, p = 0, 0
  elseif w == idx - 1 then
    c, p = 0, c
  end
  local estimate = p * (window - elapsed) / window + c + cost
  if estimate <= limit then
    redis.call('HSET', KEYS[1], 'w', idx, 'c', c + cost, 'p', p)
    redis.call('PEXPIRE', KEYS[1], 2 * window - elapsed)
    return { 1, 0, math.floor(limit - estimate), window - elapsed, 0, idx }
  end
end
-- #include rate-limit-blocks-read
local reply = { 1, 0 }
local state = {}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local limit, window, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local idx = math.floor(now / window)
  local elapsed = now - idx * window
  local h = redis.call('HMGET', KEYS[i], 'w', 'c', 'p')
  local w, c, p = tonumber(h[1]), tonumber(h[2]) or 0, tonumber(h[3]) or 0
  if w == nil or w < idx - 1 then
    c, p = 0, 0
  elseif w == idx - 1 then
    c, p = 0, c
  end
  if op == 'r' then
    if tonumber(ARGV[b + 3]) == idx and c >= cost then redis.call('HINCRBY', KEYS[i], 'c', -cost) end
  else
    local estimate = p * (window - elapsed) / window + c
    state[i] = { idx, elapsed, c, p, estimate, w }
    if estimate + cost > limit then reply[1], over[i] = 0, true end
  end
end
if op == 'r' then return reply end
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local limit, window, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local idx, elapsed, c, p, estimate, w = unpack(state[i])
  local retry = 0
  -- A Hash left without a TTL would never expire: NX repairs it (a consume sets it anyway).
  if w ~= nil and (reply[1] == 0 or op ~= 'c') then redis.call('PEXPIRE', KEYS[i], 2 * window - elapsed, 'NX') end
  if reply[1] == 1 then
    if op == 'c' then
      estimate = estimate + cost
      redis.call('HSET', KEYS[i], 'w', idx, 'c', c + cost, 'p', p)
      redis.call('PEXPIRE', KEYS[i], 2 * window - elapsed)
    end
  elseif estimate + cost > limit then
    if cost > limit then
      retry = 2 * window - elapsed
    elseif c + cost <= limit then
      -- Later in this window, once the previous window's weight has dropped far enough.
      retry = math.ceil(window * (1 - (limit - c - cost) / p)) - elapsed
    else
      -- In the next window this window's count becomes the weighted previous one.
      retry = window - elapsed + math.max(0, math.ceil(window * (1 - (limit - cost) / (c + 0.0))))
    end
    retry = math.max(1, retry)
  end
  reply[#reply + 1] = math.max(0, math.floor(limit - estimate))
  reply[#reply + 1] = window - elapsed
  reply[#reply + 1] = retry
  reply[#reply + 1] = idx
end
-- #include rate-limit-blocks-apply
return reply
