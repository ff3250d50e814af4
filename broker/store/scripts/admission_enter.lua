-- Put a waiting job back in its partition's admission line at `place` unless it is there (SPEC S4.1: a job
-- of an older broker, one a refusal or a requeue hands back, or after a lost write), and count it among its
-- fairness key's waiting jobs (SPEC S4.2) when it was not there.
-- KEYS[1] partition line zset   KEYS[2] job view hash   KEYS[3] partition fair hash   (one slot: {pN})
-- ARGV[1] job   ARGV[2] place (its score)
-- Returns 1 when the job entered the line, 0 when it was there
if redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1]) == 0 then
  return 0
end
local fair = redis.call('HMGET', KEYS[2], 'fair_key', 'fair_weight')
if fair[1] then
  redis.call('HINCRBY', KEYS[3], 'n:' .. fair[1], 1)
  redis.call('HSET', KEYS[3], 'w:' .. fair[1], fair[2] or '1')
end
return 1
