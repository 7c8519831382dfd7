-- Token bucket: a Hash per policy (t = tokens, ts = last refill ms), refilled by elapsed time on the
-- Redis clock. A request of cost n passes only when n tokens are there, so a costly request never
-- overdraws the bucket. With a delay bound, a request that would wait at most that long reserves
-- its tokens now (the balance goes below zero by exactly that future refill) and is told to wait.
-- A missing key is a full bucket, so the TTL is the time until the bucket is full again.
-- KEYS, ARGV and reply as every rate-limit script takes them: src/plugins/rate-limit/protocol.ts.
-- ARGV[1] the operation ('c' consume, 'p' peek, 'r' refund), ARGV[2] the nonce
-- KEYS[i]  Hash of policy i; a refund gives the cost back, capped at capacity; the nonce is unused here
-- per policy i, from b = 3 + (i - 1) * 4: ARGV[b] capacity, ARGV[b+1] refill tokens per second,
--          ARGV[b+2] cost, ARGV[b+3] max delay ms (0: reject instead of waiting)
-- Reply per policy: remaining, reset ms (until full), retry ms, 0
-- The common case (one policy, consume, admitted) without tables; anything else falls through to
-- the general path below, which decides afresh (nothing has been written yet).
-- #include now
if #KEYS == 1 and ARGV[1] == 'c' then
  local cap, rate, cost = tonumber(ARGV[3]), tonumber(ARGV[4]) / 1000, tonumber(ARGV[5])
  local h = redis.call('HMGET', KEYS[1], 't', 'ts')
  local tokens = cap
  if h[1] then
    local elapsed = now - tonumber(h[2])
    if elapsed < 0 then elapsed = 0 end
    tokens = tonumber(h[1]) + elapsed * rate
    if tokens > cap then tokens = cap end
  end
  local after = tokens - cost
  local wait = 0
  if after < 0 then wait = math.ceil(-after / rate) end
  if cost <= cap and wait <= tonumber(ARGV[6]) then
    local full = math.ceil((cap - after) / rate)
    redis.call('HSET', KEYS[1], 't', after, 'ts', now)
    redis.call('PEXPIRE', KEYS[1], full > 0 and full or 1)
    local left = math.floor(after)
    return { 1, wait, left > 0 and left or 0, full, 0, 0 }
  end
end
-- #include rate-limit-blocks-read
local reply = { 1, 0 }
local state = {}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local cap, rate = tonumber(ARGV[b]), tonumber(ARGV[b + 1]) / 1000
  local cost, maxDelay = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local h = redis.call('HMGET', KEYS[i], 't', 'ts')
  local tokens = cap
  if h[1] then
    tokens = math.min(cap, tonumber(h[1]) + math.max(0, now - tonumber(h[2])) * rate)
    -- A bucket left without a TTL would never expire: NX repairs it (a consume sets it anyway).
    if op ~= 'c' then redis.call('PEXPIRE', KEYS[i], math.max(1, math.ceil((cap - tokens) / rate)), 'NX') end
  end
  if op == 'r' then
    tokens = math.min(cap, tokens + cost)
    if tokens < cap then
      redis.call('HSET', KEYS[i], 't', tokens, 'ts', now)
      redis.call('PEXPIRE', KEYS[i], math.ceil((cap - tokens) / rate))
    else
      redis.call('DEL', KEYS[i])
    end
  else
    local after = tokens - cost
    local wait = 0
    if after < 0 then wait = math.ceil(-after / rate) end
    state[i] = { tokens, after, wait }
    if cost > cap or wait > maxDelay then
      reply[1], over[i] = 0, true
    elseif wait > reply[2] then
      reply[2] = wait
    end
  end
end
if op == 'r' then return reply end
if reply[1] == 0 then reply[2] = 0 end
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local cap, rate = tonumber(ARGV[b]), tonumber(ARGV[b + 1]) / 1000
  local cost = tonumber(ARGV[b + 2])
  local tokens, after, wait = unpack(state[i])
  local left, retry = after, 0
  if reply[1] == 1 and op == 'c' then
    redis.call('HSET', KEYS[i], 't', after, 'ts', now)
    redis.call('PEXPIRE', KEYS[i], math.max(1, math.ceil((cap - after) / rate)))
  else
    left = tokens
    if op == 'c' and tokens < cap then
      redis.call('PEXPIRE', KEYS[i], math.max(1, math.ceil((cap - tokens) / rate)), 'NX')
    end
  end
  if reply[1] == 0 then
    if after < 0 then retry = wait end
    if cost > cap then retry = math.ceil((cap - tokens) / rate) + 1 end
  end
  reply[#reply + 1] = math.max(0, math.floor(left))
  reply[#reply + 1] = math.ceil((cap - left) / rate)
  reply[#reply + 1] = retry
  reply[#reply + 1] = 0
end
-- #include rate-limit-blocks-apply
return reply
