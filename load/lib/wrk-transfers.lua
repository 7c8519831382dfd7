-- wrk script for POST /transfers (load/lib/wrk.ts, measureWrkTransfers): each request moves 1 VND
-- between a pair of seeded accounts, with the source's owner's session cookie and a new
-- Idempotency-Key, as the transfers scenario's autocannon requests do.
-- Arguments (after --): cookie file (one Cookie header per account index, in order), first account
-- id, pair ("random": any account to any other; "hot": every other account pays the first one),
-- key prefix (unique per run).
local cookies = {}
local first, hot, prefix
local sent = 0

function init(args)
  for line in io.lines(args[1]) do
    cookies[#cookies + 1] = line
  end
  first = tonumber(args[2])
  hot = args[3] == "hot"
  prefix = args[4]
  math.randomseed(os.time())
end

function request()
  local count = #cookies
  local from, to
  if hot then
    from, to = math.random(1, count - 1), 0
  else
    from = math.random(0, count - 1)
    to = math.random(0, count - 2)
    if to >= from then
      to = to + 1
    end
  end
  sent = sent + 1
  local body = string.format(
    '{"fromAccountId":%d,"toAccountId":%d,"amount":1,"currency":"VND"}',
    first + from,
    first + to
  )
  return wrk.format("POST", "/transfers", {
    ["Content-Type"] = "application/json",
    ["Cookie"] = cookies[from + 1],
    ["Idempotency-Key"] = prefix .. "-" .. sent,
  }, body)
end
