-- Look at a fairness key with held jobs (SPEC S4.4): the first held jobs it has room for move to its woken zset, and
-- every woken job is returned for the caller to put back in the line (again: a crash before they are back loses
-- nothing, the next look returns them). They stay woken until a pass takes or holds them. The key is looked at again
-- at `recheck`; a key over its budget returns none and is looked at again when the budget allows; a key without
-- held or woken jobs is forgotten. A key whose quota was taken out of the configuration (`applies` 0) has room for all.
-- KEYS[1] held-keys zset   KEYS[2] holds hash   KEYS[3] held count   KEYS[4] the key's live zset
-- KEYS[5] its held zset   KEYS[6] its woken zset   (one slot: {quota})
-- ARGV[1] fairness key   ARGV[2] now (epoch ms)   ARGV[3] live quota (0: none)   ARGV[4] most to return
-- ARGV[5] recheck (epoch ms)   ARGV[6] budget (0: within it; else the epoch ms it allows runs again)
-- ARGV[7] 1 while the key has a quota of live runs or tokens, else 0
-- Returns {job, place, ...}: the key's woken jobs, first places first (a place is the one the job was held at).
local key, now, limit, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local budget = tonumber(ARGV[6])
local woken = redis.call('ZCARD', KEYS[6])
if woken == 0 and redis.call('ZCARD', KEYS[5]) == 0 then
  redis.call('ZREM', KEYS[1], key)
  redis.call('HDEL', KEYS[2], key)
  return {}
end
if budget > 0 and ARGV[7] == '1' then
  redis.call('ZADD', KEYS[1], budget, key)
  redis.call('HSET', KEYS[2], key, 'budget:' .. budget)
  return {}
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local room = most
local live = redis.call('ZCARD', KEYS[4])
if limit > 0 and ARGV[7] == '1' then
  room = math.min(most, limit - live)
end
redis.call('ZADD', KEYS[1], ARGV[5], key)
redis.call('HSET', KEYS[2], key, (limit > 0 and live >= limit) and 'quota' or 'order')
local moving = room - woken
if moving > 0 then
  local first = redis.call('ZRANGE', KEYS[5], 0, moving - 1, 'WITHSCORES')
  for i = 1, #first, 2 do
    redis.call('ZREM', KEYS[5], first[i])
    redis.call('ZADD', KEYS[6], first[i + 1], first[i])
    redis.call('DECR', KEYS[3])
  end
end
return redis.call('ZRANGE', KEYS[6], 0, most - 1, 'WITHSCORES')
