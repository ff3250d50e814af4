-- Hermes refused a granted create (429, draining, unreachable, 5xx, 401/403): the job's slot is freed
-- (the caller puts the job back at the returned place of its partition's line), a 429 teaches the
-- limit, and the next probe is paced (SPEC S4.1).
-- KEYS[1] admission state hash   KEYS[2] live zset   KEYS[3] slots hash
--   (one slot: the upstream's, {adm} for the first of HERMES_URL, {adm:<name>} for the others, SPEC S10)
-- ARGV[1] job   ARGV[2] now (epoch ms)   ARGV[3] hold reason   ARGV[4] detail (Hermes's words)
-- ARGV[5] Retry-After ms ('' = none)   ARGV[6] backoff ms   ARGV[7] backoff max ms   ARGV[8] jitter in [0, 1)
-- ARGV[9] pinned limit (0 = learnt)   ARGV[10] '1' = a 429   ARGV[11] the job's place if its slot lost it
-- ARGV[12] a learnt limit's start
-- Returns {retry_at, 1 if this began a refusal, limit, 1 if the limit changed, place}
local job, now = ARGV[1], tonumber(ARGV[2])
local place = redis.call('HGET', KEYS[3], job) or ARGV[11]
redis.call('ZREM', KEYS[2], job)
redis.call('HDEL', KEYS[3], job)
local s = redis.call('HMGET', KEYS[1], 'limit', 'refusing', 'retry_at', 'streak', 'probe')
local limit = tonumber(s[1] or ARGV[12])
local changed = 0
if ARGV[10] == '1' and ARGV[9] == '0' then
  -- 429 while N of our runs are live: Hermes holds N of ours (SPEC S4.1), never fewer than one
  local live = redis.call('ZCARD', KEYS[2])
  local learnt = math.max(1, live)
  if learnt < limit then
    limit, changed = learnt, 1
    redis.call('HSET', KEYS[1], 'limit', limit, 'changed_at', now)
  end
  if live >= 1 then
    redis.call('HSET', KEYS[1], 'ceiling', learnt) -- the known capacity: slow start ends here
  end
end
local refusing = s[2] and s[2] ~= ''
local retry_at, began = tonumber(s[3] or '0'), 0
if not refusing or s[5] == job then
  -- the first refusal of a streak, or the probe's answer: pace the next probe (jittered, capped)
  local streak = tonumber(s[4] or '0')
  local ceiling = math.min(tonumber(ARGV[7]), tonumber(ARGV[6]) * 2 ^ math.min(streak, 30))
  local delay = ceiling / 2 + tonumber(ARGV[8]) * ceiling / 2
  if ARGV[5] ~= '' then
    delay = math.max(delay, tonumber(ARGV[5]))
  end
  retry_at = now + math.floor(delay)
  redis.call('HSET', KEYS[1], 'refusing', ARGV[3], 'detail', ARGV[4], 'retry_at', retry_at,
             'streak', streak + 1, 'probe', '')
  if not refusing then
    redis.call('HSET', KEYS[1], 'since', now)
    began = 1
  end
end
-- when Hermes last refused: a refusal older than the upstream's latest failed call is no longer its state
redis.call('HSET', KEYS[1], 'refused_at', now)
redis.call('HINCRBY', KEYS[1], 'refused', 1)
return {retry_at, began, limit, changed, place}
