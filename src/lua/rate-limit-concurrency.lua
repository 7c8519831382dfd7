-- Concurrency: the requests of a key in flight, a Sorted Set of slots per policy. Each slot is a
-- member '<nonce>:<n>' (the request's nonce: its fencing id) scored by the end of its lease (ms,
-- Redis clock). A consume takes slots, a refund under the request's nonce removes them (the
-- engine gives them back when the response ends); a slot never given back (its instance died)
-- stops counting when its lease ends, and is removed by the next request that finds the set full
-- with it. The admitted path is a ZCARD and an add.
-- KEYS, ARGV and reply as every rate-limit script takes them: src/plugins/rate-limit/protocol.ts.
-- ARGV[1] the operation ('c' consume, 'p' peek, 'r' refund), ARGV[2] the nonce
-- KEYS[i]  slots of policy i; a refund removes the slots taken under the nonce, ARGV[2]
-- per policy i, from b = 3 + (i - 1) * 4: ARGV[b] limit, ARGV[b+1] lease ms, ARGV[b+2] cost, ARGV[b+3] unused
-- Reply per policy: remaining, reset ms and retry ms (when enough leases end: the latest a slot
-- frees), 0; the delay is always 0
-- #include now
-- Slots are added with the lease's end. The set lives as long as its latest lease: with no live
-- slot (a new set, or only ended leases) its TTL is the lease; else it is never shortened (GT).
local function take(key, lease, cost, nonce, live)
  local add = {}
  for k = 1, cost do
    add[#add + 1] = now + lease
    add[#add + 1] = nonce .. ':' .. k
  end
  redis.call('ZADD', key, unpack(add))
  if live == 0 then
    redis.call('PEXPIRE', key, lease)
  else
    redis.call('PEXPIRE', key, lease, 'GT')
  end
end
if #KEYS == 1 and ARGV[1] == 'c' then
  local key, limit, lease, cost = KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  -- ZCARD counts ended leases too (O(1), where ZCOUNT walks the set): when even that leaves room,
  -- the request is admitted as the live count would; else the general path counts live slots.
  local held = redis.call('ZCARD', key)
  if held + cost <= limit then
    if cost == 1 then
      redis.call('ZADD', key, now + lease, ARGV[2] .. ':1')
      redis.call('PEXPIRE', key, lease, held == 0 and 'NX' or 'GT')
    else
      take(key, lease, cost, ARGV[2], held)
    end
    return { 1, 0, limit - held - cost, 0, 0, 0 }
  end
end
-- #include rate-limit-blocks-read
local nonce = ARGV[2]
local reply = { 1, 0 }
local counts = {}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local cost = tonumber(ARGV[b + 2])
  if op == 'r' then
    for k = 1, cost do redis.call('ZREM', KEYS[i], nonce .. ':' .. k) end
  else
    counts[i] = redis.call('ZCOUNT', KEYS[i], '(' .. now, '+inf')
    if counts[i] + cost > tonumber(ARGV[b]) then reply[1], over[i] = 0, true end
  end
end
if op == 'r' then return reply end
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local limit, lease, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local count, retry = counts[i], 0
  if reply[1] == 1 and op == 'c' then
    -- Ended leases go, so that the next request's ZCARD is the live count again.
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    take(KEYS[i], lease, cost, nonce, count)
    count = count + cost
  else
    -- Refused: the slots whose lease ended go. A set left without a TTL gets one (NX).
    if op == 'c' then redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now) end
    redis.call('PEXPIRE', KEYS[i], lease, 'NX')
    if count + cost > limit then
      retry = lease
      if cost <= limit then
        -- Free once enough leases end: the (count + cost - limit)-th to end.
        local slot = redis.call('ZRANGEBYSCORE', KEYS[i], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
        if slot[2] then retry = tonumber(slot[2]) - now end
      end
    end
  end
  reply[#reply + 1] = math.max(0, limit - count)
  reply[#reply + 1] = retry
  reply[#reply + 1] = retry
  reply[#reply + 1] = 0
end
-- #include rate-limit-blocks-apply
return reply
