-- Take the live runs a pass grants against their keys' `live` quotas (SPEC S4.4), or hold the jobs out of the line.
-- A job is held when its key is over its token budget, at its `live` quota, or behind its key's jobs held or woken
-- (sent back to the line, not yet taken) whose places come before its own (places carry the priority band, so a
-- more urgent job is never held behind less urgent ones). A key's jobs keep their order: a job's place is the one it
-- had when first held (a woken job taken or held again keeps it). A `new` job (its key's next, just charged its turn
-- under ADMISSION_FAIRNESS_COST time or tokens, SPEC S4.2 "What a turn costs") arrived after every held or woken job
-- of its key: a corrected turn may have placed it before them, so it is behind any of its band or a more urgent one,
-- and held at one past its band's last (never past the band's end) when its own place is smaller. A held job waits
-- in its key's held zset; the key is looked at again at `recheck` (its quota), when its budget allows (`budget`), or
-- at once (held only behind earlier jobs). A job counted live already (taken again) is counted once. A live entry
-- lapses at `expiry` unless renewed.
-- KEYS[1] held-keys zset   KEYS[2] holds hash (key -> why)   KEYS[3] held count (every key's held jobs)
-- KEYS[4] the returned hash (woken jobs that were live runs whose grant went back -> `r` refused: their wait for
--   Hermes goes on; `h` handed back: it begins again when taken)
-- KEYS[3i+2], KEYS[3i+3], KEYS[3i+4] key i's live, held and woken zsets   (one slot: {quota})
-- ARGV[1] now (epoch ms)   ARGV[2] expiry of a live entry (epoch ms)   ARGV[3] recheck (epoch ms)
-- ARGV[4] ms a key's live zset outlives its last entry
-- ARGV[5..] per job, seven values: key index i (1-based), fairness key, job, live quota (0: none), place,
--   budget (0: within it; else the epoch ms it allows runs again), new (1: its key's next, charged its turn now)
-- Returns per job 1 (taken: counted live), 2 (taken after it was held: its wait for Hermes begins now) or 0 (held),
-- in the order given.
local BASE, BAND = 2 ^ 51, 2 ^ 50

-- The exclusive end of the place's priority band as a ZCOUNT bound; for a place ahead of the bands (a resubmit's),
-- the place itself.
local function band_end(place)
  local score = tonumber(place)
  if score < BASE then
    return '(' .. place
  end
  return '(' .. string.format('%d', BASE + (math.floor((score - BASE) / BAND) + 1) * BAND)
end

-- A new job's held place: its own, or one past the last held or woken job of its band when that is later, at most
-- the band's last score (tags saturate there; jobs of one score go back in the order they were held, by the
-- members' order, as ever).
local function after_band_last(held, woken, place)
  local score = tonumber(place)
  if score < BASE then
    return place
  end
  local band = math.floor((score - BASE) / BAND)
  local low = string.format('%d', BASE + band * BAND)
  local last = score
  for _, zset in ipairs({held, woken}) do
    local top = redis.call('ZREVRANGEBYSCORE', zset, band_end(place), low, 'WITHSCORES', 'LIMIT', 0, 1)
    if top[2] and tonumber(top[2]) + 1 > last then
      last = tonumber(top[2]) + 1
    end
  end
  return string.format('%d', math.min(last, BASE + (band + 1) * BAND - 1))
end

local now = tonumber(ARGV[1])
local cleaned = {}
local taken = {}
for a = 5, #ARGV, 7 do
  local i = tonumber(ARGV[a])
  local key, job, limit, budget = ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]), tonumber(ARGV[a + 5])
  local live, held, woken = KEYS[3 * i + 2], KEYS[3 * i + 3], KEYS[3 * i + 4]
  if not cleaned[i] then
    redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
    cleaned[i] = true
  end
  local first = redis.call('ZSCORE', woken, job) or redis.call('ZSCORE', held, job)
  local returned = redis.call('HGET', KEYS[4], job)
  if returned then
    redis.call('HDEL', KEYS[4], job)
  end
  local place = first or ARGV[a + 4]
  local new = not first and ARGV[a + 6] == '1'
  local counted = redis.call('ZSCORE', live, job)
  local before = new and band_end(place) or ('(' .. place)
  local behind = redis.call('ZCOUNT', held, '-inf', before) > 0 or redis.call('ZCOUNT', woken, '-inf', before) > 0
  local full = limit > 0 and not counted and redis.call('ZCARD', live) >= limit
  if budget > 0 or full or behind then
    redis.call('ZREM', woken, job)
    if counted then
      redis.call('ZREM', live, job)
    end
    if new then
      place = after_band_last(held, woken, place)
    end
    if redis.call('ZADD', held, place, job) == 1 then
      redis.call('INCR', KEYS[3])
    end
    if budget > 0 then
      redis.call('HSET', KEYS[2], key, 'budget:' .. budget)
      redis.call('ZADD', KEYS[1], budget, key)
    elseif full then
      redis.call('HSET', KEYS[2], key, 'quota')
      redis.call('ZADD', KEYS[1], 'NX', ARGV[3], key)
    else
      if redis.call('HGET', KEYS[2], key) == false then
        redis.call('HSET', KEYS[2], key, 'order')
      end
      redis.call('ZADD', KEYS[1], 'LT', now, key)
    end
    taken[#taken + 1] = 0
  else
    redis.call('ZADD', live, ARGV[2], job)
    redis.call('PEXPIRE', live, ARGV[4])
    local from_held = redis.call('ZREM', held, job)
    if from_held == 1 then
      redis.call('DECR', KEYS[3])
    end
    taken[#taken + 1] = (first and returned ~= 'r') and 2 or 1
    redis.call('ZREM', woken, job)
  end
end
return taken
