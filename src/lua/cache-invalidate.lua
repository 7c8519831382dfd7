-- Invalidates entries after the source of truth changed: drops each value and any fill lease,
-- and replaces each generation with a new unique token, so a fill that read the old generation
-- (its load may predate the change) is refused. A unique token, unlike a counter, stays a fence
-- even if an evicting Redis drops the generation key and a reader recreates it. One token serves
-- every entry of a call: what must be unique is each key's next generation, not the keys'.
-- KEYS value, generation and lease of each entry, three by three (on a Cluster, one entry a call)
-- ARGV[1] a fresh generation token   ARGV[2] generation TTL ms
-- Reply: the number of entries
for i = 1, #KEYS, 3 do
  redis.call('SET', KEYS[i + 1], ARGV[1], 'PX', ARGV[2])
  redis.call('DEL', KEYS[i], KEYS[i + 2])
end
return #KEYS / 3
