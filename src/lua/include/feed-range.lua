-- Pages of a feed or a timeline, newest first (src/primitives/feed.ts). Items are members scored
-- by their time in ms (0 or more); the placeholder '' (score -1 or -2) is never listed. Equal
-- scores order by member, and a member starts with its item's id (a feed's members are
-- '<id> <producer>', a timeline's '<id>'), ids holding no byte below '!': (score, member) order is
-- (at, id) order.

-- Bytewise a < b. Lua's own string comparison follows the server's collation locale.
local function feedBytesLess(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Up to k members of `key` before the cursor (cursorAt, cursorId) that keep(member) accepts (nil:
-- all), newest first (cursorAt '': from the newest), reading `slack` more than k at a time.
-- Returns {member, score, ...} and whether nothing is left before the last one returned.
local function feedRange(key, cursorAt, cursorId, k, keep, slack)
  local out = {}
  local max, at = '+inf', nil
  if cursorAt ~= '' then
    max, at = cursorAt, tonumber(cursorAt)
  end
  local chunk = k + slack
  local offset = 0
  while true do
    local page = redis.call('ZRANGE', key, max, '0', 'BYSCORE', 'REV', 'LIMIT', offset, chunk, 'WITHSCORES')
    for i = 1, #page, 2 do
      local member, score = page[i], page[i + 1]
      if (at == nil or tonumber(score) < at or feedBytesLess(member, cursorId)) and (keep == nil or keep(member)) then
        out[#out + 1] = member
        out[#out + 1] = score
        if #out == 2 * k then return out, #page < 2 * chunk and i + 1 == #page end
      end
    end
    if #page < 2 * chunk then return out, true end
    offset = offset + chunk
  end
end
