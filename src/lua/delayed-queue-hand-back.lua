-- A stopping instance hands back: every id of its processing list returns to ready, its take times
-- and its heartbeat go, so a live instance adopts its delayed set at its next adoption round.
-- KEYS[1] this instance's processing list, KEYS[2] its take times, KEYS[3] the ready list,
-- KEYS[4] this instance's heartbeat
-- ARGV none
-- Reply: the number of entries returned to ready
local returned = 0
while redis.call('LMOVE', KEYS[1], KEYS[3], 'LEFT', 'RIGHT') do
  returned = returned + 1
end
redis.call('DEL', KEYS[2], KEYS[4])
return returned
