-- Mend one slice of a partition's fair top zset from its fair hash (SPEC S4.2 top keys): the hash is what every
-- broker version counts in; an older broker's scripts leave the zset alone, so a key it counted may be missing
-- there, or be there with a stale count or after the hash forgot it. One call reads at most ARGV[3] fields of
-- each (HSCAN, ZSCAN), so it is short whatever the number of keys; a caller walks the cursors to the end.
-- KEYS[1] partition fair hash   KEYS[2] partition fair top zset   (one slot: {pN})
-- ARGV[1] hash cursor   ARGV[2] zset cursor   ARGV[3] fields per scan ('done' for a cursor: that scan is skipped)
-- Returns {next hash cursor, next zset cursor, entries mended} ('0': that scan reached its end)
local mended = 0
local scan = {'done', {}}
if ARGV[1] ~= 'done' then
  scan = redis.call('HSCAN', KEYS[1], ARGV[1], 'MATCH', 'n:*', 'COUNT', ARGV[3])
end
local found = scan[2]
for i = 1, #found, 2 do
  local key, n = string.sub(found[i], 3), tonumber(found[i + 1])
  if n and n > 0 and tonumber(redis.call('ZSCORE', KEYS[2], key) or '0') ~= n then
    redis.call('ZADD', KEYS[2], n, key)
    mended = mended + 1
  end
end
local zscan = {'done', {}}
if ARGV[2] ~= 'done' then
  zscan = redis.call('ZSCAN', KEYS[2], ARGV[2], 'COUNT', ARGV[3])
end
local listed = zscan[2]
for i = 1, #listed, 2 do
  if not redis.call('HGET', KEYS[1], 'n:' .. listed[i]) then
    redis.call('ZREM', KEYS[2], listed[i])
    mended = mended + 1
  end
end
return {scan[1], zscan[1], mended}
