-- Fixed window: one counter per policy. A key's window starts with its first request and ends when
-- its PEXPIRE runs out, on the Redis clock (no app clock, and clients do not all reset at once).
-- Every policy in one call shares a key identity and hash tag; the decision is all-or-nothing.
-- KEYS, ARGV and reply as every rate-limit script takes them: src/plugins/rate-limit/protocol.ts.
-- ARGV[1] the operation ('c' consume, 'p' peek, 'r' refund), ARGV[2] the nonce
-- KEYS[i]  counter String of policy i; the nonce is unused here
-- per policy i, from b = 3 + (i - 1) * 4: ARGV[b] limit, ARGV[b+1] window ms, ARGV[b+2] cost,
--          ARGV[b+3] the window's remaining ms at the consume being refunded (op 'r' only)
-- Penalties: a policy with ban, exponentialBackoff or continueExceeding has its rejections key
--          (rejected requests of the current window, same TTL as the counter), with
--          spec = (ban + 1) * 4 + 2 * backoff + continue (ban -1: none). A consume a policy rejects counts one rejection;
--          the k-th restarts the window (continue) or sets its TTL to window * 2^(k-1), at most
--          max(window, 2^31 - 1) (backoff); past `ban` rejections the policy rejects every
--          request until the window ends (banned).
-- Reply per policy: remaining, reset ms, retry ms, reset ms (the refund's window); the delay is
--        always 0; with penalties, each policy's ban state (0, 1 banned, 2 banned from this request on)
-- The common case (one policy, consume) without tables or a second pass: same reply.
if #KEYS == 1 and ARGV[1] == 'c' then
  local key, limit, cost = KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[5])
  local count = redis.call('INCRBY', key, cost)
  local ttl
  if count == cost then
    ttl = tonumber(ARGV[4])
    redis.call('PEXPIRE', key, ttl)
  else
    ttl = redis.call('PTTL', key)
    if ttl < 0 then
      ttl = tonumber(ARGV[4])
      redis.call('PEXPIRE', key, ttl)
    elseif ttl == 0 then
      -- Redis keeps a key through the millisecond it expires at, when its window has ended: a new
      -- window starts with this request.
      ttl = tonumber(ARGV[4])
      count = cost
      redis.call('SET', key, count, 'PX', ttl)
    end
  end
  if count <= limit then return { 1, 0, limit - count, ttl, 0, ttl } end
  redis.call('DECRBY', key, cost)
  count = count - cost
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end
  return { 0, 0, remaining, ttl, ttl, ttl }
end
-- #include rate-limit-blocks-read
local penalty, penalties = {}, false
if op ~= 'r' then
  for j = 1, #KEYS - n do
    local at = 2 + 4 * n + 2 * j
    local i = tonumber(ARGV[at - 1])
    if i < 0 then
      local spec = tonumber(ARGV[at])
      penalty[-i] = {
        key = KEYS[n + j],
        ban = math.floor(spec / 4) - 1,
        backoff = spec % 4 >= 2,
        continue = spec % 2 == 1,
        rejected = tonumber(redis.call('GET', KEYS[n + j]) or '0'),
      }
      penalties = true
    end
  end
end
local reply = { 1, 0 }
local counts, ttls, banned = {}, {}, {}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local limit, window, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local count
  local pen = penalty[i]
  -- A window ends at its key's expiry time, which Redis still holds for that millisecond.
  if redis.call('PTTL', KEYS[i]) == 0 then redis.call('DEL', KEYS[i]) end
  if op == 'c' then
    -- Count first and undo below if any policy is over: one write on the common path.
    count = redis.call('INCRBY', KEYS[i], cost)
    -- A new window: the rejections of an older one are gone with it.
    if pen and count == cost and pen.rejected > 0 then
      pen.rejected = 0
      redis.call('DEL', pen.key)
    end
  else
    count = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  -- Banned: every request is rejected until the window ends.
  if pen and pen.ban >= 0 and pen.rejected > pen.ban and count > 0 then banned[i] = 1 end
  if op == 'c' and (count > limit or banned[i]) then reply[1], over[i] = 0, true end
  local ttl = window
  if count == cost and op == 'c' then
    redis.call('PEXPIRE', KEYS[i], window)
  elseif count > 0 then
    ttl = redis.call('PTTL', KEYS[i])
    -- A counter without a TTL would lock its client out forever: repair it on every visit.
    if ttl < 0 then
      redis.call('PEXPIRE', KEYS[i], window)
      ttl = window
    end
  end
  if op == 'r' then
    -- A TTL above the one seen at the consume belongs to a newer window: nothing to give back there.
    if count >= cost and ttl <= tonumber(ARGV[b + 3]) then redis.call('DECRBY', KEYS[i], cost) end
  elseif op == 'p' and (count + cost > limit or banned[i]) then
    reply[1], over[i] = 0, true
  end
  counts[i], ttls[i] = count, ttl
end
if op == 'r' then return reply end
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local limit, window, cost = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local count, retry = counts[i], 0
  if op == 'c' and reply[1] == 0 then
    redis.call('DECRBY', KEYS[i], cost)
    count = count - cost
    -- A rejection this policy decided (not one of a sibling's) is counted, and penalised.
    local pen = penalty[i]
    if pen and over[i] then
      local k = pen.rejected + 1
      local ttl = ttls[i]
      if pen.continue then
        ttl = window
      elseif pen.backoff then
        ttl = math.min(window * 2 ^ (k - 1), math.max(window, 2147483647))
      end
      if ttl ~= ttls[i] then redis.call('PEXPIRE', KEYS[i], ttl) end
      redis.call('SET', pen.key, k, 'PX', ttl)
      ttls[i] = ttl
      if pen.ban >= 0 and k > pen.ban then banned[i] = k == pen.ban + 1 and 2 or 1 end
    end
  end
  if reply[1] == 0 and (count + cost > limit or banned[i]) then retry = ttls[i] end
  reply[#reply + 1] = banned[i] and 0 or math.max(0, limit - count)
  reply[#reply + 1] = ttls[i]
  reply[#reply + 1] = retry
  reply[#reply + 1] = ttls[i]
end
-- #include rate-limit-blocks-apply
if penalties then
  for i = 1, n do reply[#reply + 1] = banned[i] or 0 end
end
return reply
