-- The time on the Redis clock, never the app's (app servers' clocks differ; Redis's is the one every
-- caller shares): `now` in epoch ms, `now_us` in epoch microseconds as a string of digits (exact).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_us = time[1] .. string.format('%06d', tonumber(time[2]))
