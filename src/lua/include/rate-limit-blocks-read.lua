-- Blocks (policies with blockMs): after the n policy keys come one block key per such policy,
-- KEYS[n + j], with ARGV[2 + 4n + 2j - 1] the index of its policy and ARGV[2 + 4n + 2j] its block ms.
-- A negative index is not a block: the fixed window's penalty key of policy -index (see that script).
local n = (#ARGV - 2) / 2 - #KEYS
local requested = ARGV[1]
local op = requested
local blocked, anyBlocked, over = {}, false, {}
if op ~= 'r' then
  for j = 1, #KEYS - n do
    local at = 2 + 4 * n + 2 * j
    if tonumber(ARGV[at - 1]) > 0 then
      local ttl = redis.call('PTTL', KEYS[n + j])
      -- A block without a TTL would never end: it gets its policy's block time.
      if ttl == -1 then
        ttl = tonumber(ARGV[at])
        redis.call('PEXPIRE', KEYS[n + j], ttl)
      end
      if ttl > 0 then
        blocked[tonumber(ARGV[at - 1])] = ttl
        anyBlocked = true
      end
    end
  end
  -- A blocked request is only looked at: nothing is counted while any of its policies is blocked.
  if anyBlocked then op = 'p' end
end
