-- Adds amounts to members' scores on one leaderboard, each at most once per id: a redelivered
-- source event (at-least-once upstream) finds its id in the set and changes nothing.
-- Scores are stored negated (-volume), so that an ascending ZRANGE lists the highest volume first
-- and equal volumes in ascending member order (Redis orders equal scores by member): a tie rule
-- that needs no second number packed into the double. Every score is an exact integer: volumes
-- saturate at 2^53 - 1, the largest integer a double holds exactly.
-- KEYS[1] the board (sorted set), KEYS[2] the ids already counted (set); same hash tag
-- ARGV[1] when both keys expire, unix ms (PEXPIREAT; 0: never)
-- then per item: id, member, amount (a positive integer)
-- Reply: how many items were counted now (the others had been counted before)
local MAX = 9007199254740991
local counted = 0
for i = 2, #ARGV, 3 do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    -- The increment goes as the caller's digits: a Lua number would be formatted with %.14g.
    local score = tonumber(redis.call('ZINCRBY', KEYS[1], '-' .. ARGV[i + 2], ARGV[i + 1]))
    if score < -MAX then
      redis.call('ZADD', KEYS[1], string.format('%.0f', -MAX), ARGV[i + 1])
    end
    counted = counted + 1
  end
end
if ARGV[1] ~= '0' then
  redis.call('PEXPIREAT', KEYS[1], ARGV[1])
  redis.call('PEXPIREAT', KEYS[2], ARGV[1])
end
return counted
