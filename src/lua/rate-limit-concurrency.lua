-- Concurrency: the requests of a key in flight, a Hash of slots per policy. Each slot is a field
-- '<nonce>:<n>' (the request's nonce: its fencing id) whose value is the end of its lease (ms,
-- Redis clock). A consume takes slots, a refund under the request's nonce removes them (the
-- engine gives them back when the response ends); a slot never given back (its instance died)
-- stops counting when its lease ends, and is removed by the next request that finds the hash full
-- with it. The admitted path is an HLEN and an HSET (a hash, not a sorted set: nothing is kept in
-- order on the path every request takes; the order of lease ends is needed only on a refusal).
-- KEYS, ARGV and reply as every rate-limit script takes them: src/plugins/rate-limit/protocol.ts.
-- ARGV[1] the operation ('c' consume, 'p' peek, 'r' refund), ARGV[2] the nonce
-- KEYS[i]  slots of policy i; a refund removes the slots taken under the nonce, ARGV[2]
-- per policy i, from b = 3 + (i - 1) * 4: ARGV[b] limit, ARGV[b+1] lease ms, ARGV[b+2] cost, ARGV[b+3] unused
-- Reply per policy: remaining, reset ms and retry ms (when enough leases end: the latest a slot
-- frees), 0; the delay is always 0
-- #include now
-- Slots are added with the lease's end. The hash lives as long as its latest lease: a new hash
-- gets the lease as its TTL; else it is never shortened (GT: every lease is as long, so the new one
-- ends last).
local function take(key, lease, cost, nonce, held)
  if cost == 1 then
    redis.call('HSET', key, nonce .. ':1', now + lease)
  else
    local add = {}
    for k = 1, cost do
      add[#add + 1] = nonce .. ':' .. k
      add[#add + 1] = now + lease
    end
    redis.call('HSET', key, unpack(add))
  end
  redis.call('PEXPIRE', key, lease, held == 0 and 'NX' or 'GT')
end
if #KEYS == 1 and ARGV[1] == 'c' then
  local key, limit, lease, cost = KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  -- HLEN counts ended leases too (O(1), where counting live slots reads them all): when even that
  -- leaves room, the request is admitted as the live count would; else the general path counts.
  local held = redis.call('HLEN', key)
  if held + cost <= limit then
    take(key, lease, cost, ARGV[2], held)
    return { 1, 0, limit - held - cost, 0, 0, 0 }
  end
end
-- #include rate-limit-blocks-read
local nonce = ARGV[2]
local reply = { 1, 0 }
-- Per policy: the live slots' lease ends, ascending.
local lives = {}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local cost = tonumber(ARGV[b + 2])
  if op == 'r' then
    for k = 1, cost do redis.call('HDEL', KEYS[i], nonce .. ':' .. k) end
  else
    local slots, live, ended = redis.call('HGETALL', KEYS[i]), {}, {}
    for j = 1, #slots, 2 do
      local ends = tonumber(slots[j + 1])
      if ends > now then live[#live + 1] = ends else ended[#ended + 1] = slots[j] end
    end
    -- Ended leases go (a consume only: a peek writes nothing), so that HLEN is the live count again.
    if op == 'c' and #ended > 0 then redis.call('HDEL', KEYS[i], unpack(ended)) end
    table.sort(live)
    lives[i] = live
    if #live + cost > tonumber(ARGV[b]) then reply[1], over[i] = 0, true end
  end
end
if op == 'r' then return reply end
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local limit, lease, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local count, retry = #lives[i], 0
  if reply[1] == 1 and op == 'c' then
    take(KEYS[i], lease, cost, nonce, count)
    count = count + cost
  else
    -- A hash left without a TTL gets one (NX).
    redis.call('PEXPIRE', KEYS[i], lease, 'NX')
    if count + cost > limit then
      retry = lease
      -- Free once enough leases end: the (count + cost - limit)-th to end.
      if cost <= limit then retry = lives[i][count + cost - limit] - now end
    end
  end
  reply[#reply + 1] = math.max(0, limit - count)
  reply[#reply + 1] = retry
  reply[#reply + 1] = retry
  reply[#reply + 1] = 0
end
-- #include rate-limit-blocks-apply
return reply
