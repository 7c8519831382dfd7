-- A policy that went over its limit on a consume starts its block; a blocked policy reports it.
if #KEYS > n then
  for j = 1, #KEYS - n do
    local at = 2 + 4 * n + 2 * j
    local i = tonumber(ARGV[at - 1])
    local ttl = blocked[i]
    if i > 0 and not ttl and requested == 'c' and not anyBlocked and over[i] then
      ttl = tonumber(ARGV[at])
      redis.call('SET', KEYS[n + j], 1, 'PX', ttl)
    end
    if ttl then
      local r = 2 + (i - 1) * 4
      reply[r + 1] = 0
      if ttl > reply[r + 2] then reply[r + 2] = ttl end
      if ttl > reply[r + 3] then reply[r + 3] = ttl end
    end
  end
  if anyBlocked then reply[1], reply[2] = 0, 0 end
end
