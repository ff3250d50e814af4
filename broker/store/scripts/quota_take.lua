-- Take the live runs a pass grants against their keys' `live` quotas (SPEC S4.4), or hold the jobs out of the line.
-- A job is held when its key is over its token budget, at its `live` quota, or has older held jobs (the key's jobs
-- keep their order: a later job never passes an earlier held one). A held job waits in its key's held zset at its
-- place in the line; the key is looked at again at `recheck` (a quota), or when its budget allows (`budget`).
-- KEYS[1] held-keys zset   KEYS[2] holds hash   KEYS[2i+1], KEYS[2i+2] key i's live and held zsets
--   (one slot: {quota})
-- ARGV[1] now (epoch ms)   ARGV[2] expiry of a live entry (epoch ms)   ARGV[3] recheck (epoch ms)
-- ARGV[4..] per job, six values: key index i (1-based), fairness key, job, live quota (0: none), place,
--   budget (0: within it; else the epoch ms it allows runs again)
-- Returns per job 1 (taken: counted live), 2 (taken after it was held) or 0 (held), in the order given.
local now = tonumber(ARGV[1])
local cleaned = {}
local taken = {}
for a = 4, #ARGV, 6 do
  local i = tonumber(ARGV[a])
  local key, job, limit, place, budget = ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]), ARGV[a + 4], tonumber(ARGV[a + 5])
  local live, held = KEYS[2 * i + 1], KEYS[2 * i + 2]
  if not cleaned[i] then
    redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
    cleaned[i] = true
  end
  local first = redis.call('ZRANGE', held, 0, 0, 'WITHSCORES')
  local behind = first[1] and first[1] ~= job and tonumber(first[2]) < tonumber(place)
  local full = limit > 0 and redis.call('ZCARD', live) >= limit
  if budget > 0 or behind or full then
    redis.call('ZADD', held, place, job)
    if budget > 0 then
      redis.call('HSET', KEYS[2], key, 'budget:' .. budget)
      redis.call('ZADD', KEYS[1], budget, key)
    else
      if redis.call('HGET', KEYS[2], key) == false then
        redis.call('HSET', KEYS[2], key, 'quota')
      end
      redis.call('ZADD', KEYS[1], 'NX', ARGV[3], key)
    end
    taken[#taken + 1] = 0
  else
    redis.call('ZADD', live, ARGV[2], job)
    taken[#taken + 1] = 1 + redis.call('ZREM', held, job)
  end
end
return taken
