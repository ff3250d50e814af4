-- Take the live runs a pass grants against their keys' `live` quotas (SPEC S4.4), or hold the jobs out of the line.
-- A job is held when its key is over its token budget, at its `live` quota, or has earlier jobs held or sent back
-- to the line and not yet taken (a key's jobs keep their order: a job that was never held never passes one that
-- was; a resubmit, ahead of every band, is not held for order). A held job waits in its key's held zset at its
-- place; the key is looked at again at `recheck` (a quota) or when its budget allows (`budget`). A job counted live
-- already (taken again) is counted once. A live entry expires at `expiry` unless renewed.
-- KEYS[1] held-keys zset   KEYS[2] holds hash (`#held`: every key's held jobs)
-- KEYS[3i], KEYS[3i+1], KEYS[3i+2] key i's live, held and woken zsets   (one slot: {quota})
-- ARGV[1] now (epoch ms)   ARGV[2] expiry of a live entry (epoch ms)   ARGV[3] recheck (epoch ms)
-- ARGV[4] ms a key's live zset outlives its last entry
-- ARGV[5..] per job, six values: key index i (1-based), fairness key, job, live quota (0: none), place,
--   budget (0: within it; else the epoch ms it allows runs again)
-- Returns per job 1 (taken: counted live), 2 (taken after it was held) or 0 (held), in the order given.
local now = tonumber(ARGV[1])
local cleaned = {}
local taken = {}
for a = 5, #ARGV, 6 do
  local i = tonumber(ARGV[a])
  local key, job, limit, place, budget = ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]), ARGV[a + 4], tonumber(ARGV[a + 5])
  local live, held, woken = KEYS[3 * i], KEYS[3 * i + 1], KEYS[3 * i + 2]
  if not cleaned[i] then
    redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
    cleaned[i] = true
  end
  local was_held = redis.call('ZSCORE', held, job) or redis.call('ZSCORE', woken, job)
  local counted = redis.call('ZSCORE', live, job)
  local earlier = not was_held and tonumber(place) >= 2 ^ 51
    and (redis.call('ZCARD', held) > 0 or redis.call('ZCARD', woken) > 0)
  local full = limit > 0 and not counted and redis.call('ZCARD', live) >= limit
  if budget > 0 or earlier or full then
    redis.call('ZREM', woken, job)
    if counted then
      redis.call('ZREM', live, job)
    end
    if redis.call('ZADD', held, place, job) == 1 then
      redis.call('HINCRBY', KEYS[2], '#held', 1)
    end
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
    redis.call('PEXPIRE', live, ARGV[4])
    local from_held = redis.call('ZREM', held, job)
    if from_held == 1 then
      redis.call('HINCRBY', KEYS[2], '#held', -1)
    end
    taken[#taken + 1] = (from_held + redis.call('ZREM', woken, job) > 0) and 2 or 1
  end
end
return taken
