-- GCRA (generic cell rate algorithm): one theoretical arrival time (TAT, ms) per policy. Each unit of
-- cost advances the TAT by period / limit; a request passes while the TAT stays within one period
-- of now, which allows a burst of `limit` and then an even `limit` per period.
-- KEYS, ARGV and reply as every rate-limit script takes them: src/plugins/rate-limit/protocol.ts.
-- ARGV[1] the operation ('c' consume, 'p' peek, 'r' refund), ARGV[2] the nonce
-- KEYS[i]  TAT String of policy i; a refund moves the TAT back by the cost; the nonce is unused here
-- per policy i, from b = 3 + (i - 1) * 4: ARGV[b] limit, ARGV[b+1] period ms, ARGV[b+2] cost,
--          ARGV[b+3] max delay ms (0: reject instead of waiting)
-- Reply per policy: remaining, reset ms (until the TAT is now), retry ms, 0
-- The common case (one policy, consume, admitted) without tables; anything else falls through to
-- the general path below, which decides afresh (nothing has been written yet).
-- #include now
if #KEYS == 1 and ARGV[1] == 'c' then
  local limit, period, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local interval = period / limit
  local tat = tonumber(redis.call('GET', KEYS[1])) or now
  if tat < now then tat = now end
  local newTat = tat + cost * interval
  local wait = math.ceil(newTat - now - period - 0.001)
  if wait < 0 then wait = 0 end
  if cost <= limit and wait <= tonumber(ARGV[6]) then
    local ahead = math.ceil(newTat - now)
    redis.call('SET', KEYS[1], newTat, 'PX', ahead > 0 and ahead or 1)
    local remaining = math.floor((period - (newTat - now)) / interval + 0.000001)
    return { 1, wait, remaining > 0 and remaining or 0, ahead, 0, 0 }
  end
end
-- #include rate-limit-blocks-read
local reply = { 1, 0 }
local state = {}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local limit, period = tonumber(ARGV[b]), tonumber(ARGV[b + 1])
  local cost, maxDelay = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local interval = period / limit
  local stored = tonumber(redis.call('GET', KEYS[i]))
  local tat = math.max(stored or now, now)
  if op == 'r' then
    if stored and stored > now then
      local back = math.max(now, stored - cost * interval)
      redis.call('SET', KEYS[i], back, 'PX', math.max(1, math.ceil(back - now)))
    end
  else
    local newTat = tat + cost * interval
    -- The microsecond slack absorbs float rounding of period / limit, so exactly `limit` fit.
    local wait = math.max(0, math.ceil(newTat - now - period - 0.001))
    state[i] = { tat, newTat, wait, interval }
    if cost > limit or wait > maxDelay then
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
  local period = tonumber(ARGV[b + 1])
  local tat, newTat, wait, interval = unpack(state[i])
  local retry = 0
  if reply[1] == 0 or op ~= 'c' then
    -- A TAT left without a TTL would never expire: NX repairs it (a consume rewrites it with PX).
    redis.call('PEXPIRE', KEYS[i], math.max(1, math.ceil(tat - now)), 'NX')
  end
  if reply[1] == 1 and op == 'c' then
    tat = newTat
    redis.call('SET', KEYS[i], newTat, 'PX', math.max(1, math.ceil(newTat - now)))
  elseif reply[1] == 0 and wait > 0 then
    retry = wait
  end
  if tonumber(ARGV[b + 2]) > tonumber(ARGV[b]) then retry = math.max(1, math.ceil(tat - now)) end
  reply[#reply + 1] = math.max(0, math.floor((period - (tat - now)) / interval + 0.000001))
  reply[#reply + 1] = math.ceil(tat - now)
  reply[#reply + 1] = retry
  reply[#reply + 1] = 0
end
-- #include rate-limit-blocks-apply
return reply
