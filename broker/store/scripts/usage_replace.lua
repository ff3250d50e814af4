-- Replace one hour's usage with what the rebuild recomputed from the job streams (SPEC S4.5, S7), unless the hour
-- counted a fact the rebuild does not know (a replica's sweep counted it after the rebuild read the streams): then
-- nothing changes and the rebuild reports the hour as changed meanwhile.
-- KEYS[1] the hour's counters hash   KEYS[2] the hour's ranking zset   KEYS[3] the hour's markers set
--   (one slot: the three keys carry the hour's tag {u:H})
-- ARGV[1] when the hour's keys expire (epoch ms)   ARGV[2] n, the number of markers that follow
-- ARGV[3..2+n] the markers of every fact the rebuild counted in the hour
-- ARGV[3+n..] per fairness key: key, its eight comma-joined counters, its Hermes ms
-- Returns 1 (replaced) or 0 (refused).
local n = tonumber(ARGV[2])
local known = {}
for i = 3, 2 + n do
  known[ARGV[i]] = true
end
for _, marker in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if not known[marker] then
    return 0
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
for i = 3, 2 + n, 1000 do
  redis.call('SADD', KEYS[3], unpack(ARGV, i, math.min(i + 999, 2 + n)))
end
for i = 3 + n, #ARGV, 3 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], ARGV[i + 2], ARGV[i])
end
for k = 1, 3 do
  redis.call('PEXPIREAT', KEYS[k], ARGV[1])
end
return 1
