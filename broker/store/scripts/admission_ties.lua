-- The jobs of one partition's admission line that share one score (SPEC S4.2: keys without a turn, created
-- between two grants, get one start tag), oldest first by their created ms (the arrivals zset the job write
-- keeps; unknown last), at most ARGV[2] of them: a pass that reaches such a tie grants them in arrival order.
-- Read only.
-- KEYS[1] partition line zset   KEYS[2] partition arrivals zset   (one slot: {pN})
-- ARGV[1] the score   ARGV[2] how many
-- Returns {job, arrival ms ('' = unknown), ...}
local members = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1], 'LIMIT', 0, 1000)
local found = {}
for _, job in ipairs(members) do
  local at = redis.call('ZSCORE', KEYS[2], job)
  found[#found + 1] = {job, at and tonumber(at) or math.huge}
end
table.sort(found, function(a, b)
  if a[2] ~= b[2] then
    return a[2] < b[2]
  end
  return a[1] < b[1]
end)
local reply = {}
for i = 1, math.min(#found, tonumber(ARGV[2])) do
  reply[#reply + 1] = found[i][1]
  reply[#reply + 1] = found[i][2] == math.huge and '' or string.format('%.0f', found[i][2])
end
return reply
