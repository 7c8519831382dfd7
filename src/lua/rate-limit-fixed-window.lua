-- Fixed window: one counter per policy, windows aligned to the Redis clock (floor(now / window)).
-- Every policy in one call shares a key identity and hash tag; the decision is all-or-nothing.
-- KEYS[i]  counter String of policy i
-- ARGV[1]  op: 'c' consume, 'p' peek (decide, change nothing), 'r' refund an earlier consume
-- ARGV[2]  unused here (the nonce slot, kept so every rate-limit script has the same layout)
-- per policy i, from b = 3 + (i - 1) * 4: ARGV[b] limit, ARGV[b+1] window ms, ARGV[b+2] cost,
--          ARGV[b+3] window start of the consume being refunded (op 'r' only)
-- Reply: { allowed 0/1, delay ms (always 0), then per policy: remaining, reset ms, retry ms, window start }
--        (remaining counts this request on a consume; on a peek it is the quota as it stands)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]
local reply = { 1, 0 }
local counts = {}
for i = 1, #KEYS do
  local b = 3 + (i - 1) * 4
  local limit, window, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local start = now - now % window
  if op == 'c' then
    -- Count first, undo below if any policy is over: one write on the common path.
    counts[i] = redis.call('INCRBY', KEYS[i], cost)
    if counts[i] > limit then reply[1] = 0 end
  else
    counts[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
    if op == 'r' then
      if tonumber(ARGV[b + 3]) == start and counts[i] >= cost then redis.call('DECRBY', KEYS[i], cost) end
    elseif counts[i] + cost > limit then
      reply[1] = 0
    end
  end
  -- NX: sets the TTL of a new counter and repairs one that lost it, never moves an existing one.
  if counts[i] > 0 then redis.call('PEXPIRE', KEYS[i], start + window - now, 'NX') end
end
if op == 'r' then return reply end
for i = 1, #KEYS do
  local b = 3 + (i - 1) * 4
  local limit, window, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local start = now - now % window
  local count, retry = counts[i], 0
  if op == 'c' and reply[1] == 0 then
    redis.call('DECRBY', KEYS[i], cost)
    count = count - cost
  end
  if reply[1] == 0 and count + cost > limit then retry = start + window - now end
  reply[#reply + 1] = math.max(0, limit - count)
  reply[#reply + 1] = start + window - now
  reply[#reply + 1] = retry
  reply[#reply + 1] = start
end
return reply
