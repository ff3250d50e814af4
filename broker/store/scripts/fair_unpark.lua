-- Before going back to a broker without cost-aware turns (SPEC S4.2 "What a turn costs"; its passes read the line
-- only): the partition's parked jobs join its line at their parked score (band + projection: behind their key's
-- front, in their key's order), at most ARGV[1] of them per call; once none is left the fronts entries go too (a
-- front without one is planned as a single head). Every replica hears that the line changed (`line J` of the first:
-- a pass reads the job's whole partition).
-- KEYS[1] partition line zset   KEYS[2] partition parked zset   KEYS[3] partition fronts hash
--   (one slot: the partition {pN})
-- ARGV[1] how many at most   ARGV[2] the signals channel   ARGV[3] the `line ` prefix of the messages
-- Returns the parked jobs left
local parked = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #parked, 2 do
  redis.call('ZADD', KEYS[1], 'NX', parked[i + 1], parked[i])
  redis.call('ZREM', KEYS[2], parked[i])
end
if #parked > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3] .. parked[1])
end
local left = redis.call('ZCARD', KEYS[2])
if left == 0 then
  redis.call('DEL', KEYS[3])
end
return left
