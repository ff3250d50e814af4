-- Look at a fairness key with held jobs (SPEC S4.4): the first jobs it has room for go back to their places in the
-- line (the caller enters them; they stay held until a pass takes them, so a crash before they are back in the line
-- loses nothing: the next look returns them again), and the key is looked at again at `recheck`. A key over its
-- budget returns none and is looked at again when the budget allows. A key without held jobs is forgotten.
-- KEYS[1] held-keys zset   KEYS[2] holds hash   KEYS[3] the key's live zset   KEYS[4] its held zset
--   (one slot: {quota})
-- ARGV[1] fairness key   ARGV[2] now (epoch ms)   ARGV[3] live quota (0: none)   ARGV[4] most to return
-- ARGV[5] recheck (epoch ms)   ARGV[6] budget (0: within it; else the epoch ms it allows runs again)
-- Returns {job, place, ...} to return to the line.
local key, now, limit, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local budget = tonumber(ARGV[6])
if redis.call('ZCARD', KEYS[4]) == 0 then
  redis.call('ZREM', KEYS[1], key)
  redis.call('HDEL', KEYS[2], key)
  return {}
end
if budget > 0 then
  redis.call('ZADD', KEYS[1], budget, key)
  redis.call('HSET', KEYS[2], key, 'budget:' .. budget)
  return {}
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local room = most
if limit > 0 then
  room = math.min(most, limit - redis.call('ZCARD', KEYS[3]))
end
redis.call('ZADD', KEYS[1], ARGV[5], key)
redis.call('HSET', KEYS[2], key, 'quota')
if room <= 0 then
  return {}
end
return redis.call('ZRANGE', KEYS[4], 0, room - 1, 'WITHSCORES')
