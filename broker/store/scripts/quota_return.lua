-- A live run of a key with a quota whose grant went back to the line (Hermes refused it, a draining replica handed
-- it back; SPEC S4.4): it is no longer live, and it waits woken at the front of its key's jobs held or woken in its
-- priority band (it was taken ahead of them), so the key's later jobs, however a corrected turn placed them, wait
-- behind it and its key's room goes to it first. The key is due to be looked at now.
-- KEYS[1] held-keys zset   KEYS[2] holds hash   KEYS[3] the key's live zset   KEYS[4] its held zset
-- KEYS[5] its woken zset   KEYS[6] the returned hash (job -> `r`: refused, its wait for Hermes goes on when a pass
--   takes it; `h`: handed back before Hermes answered, its wait begins again; a pass or a forget takes it out)
--   (one slot: {quota})
-- ARGV[1] fairness key   ARGV[2] job   ARGV[3] its place in the line   ARGV[4] `r` or `h`
-- Returns the place it waits woken at.
local BASE, BAND = 2 ^ 51, 2 ^ 50
redis.call('ZREM', KEYS[3], ARGV[2])
local place = tonumber(ARGV[3])
if place >= BASE then
  local low = BASE + math.floor((place - BASE) / BAND) * BAND
  for _, zset in ipairs({KEYS[4], KEYS[5]}) do
    local first = redis.call('ZRANGEBYSCORE', zset, string.format('%d', low), '(' .. string.format('%d', place),
      'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] then
      place = math.max(low, tonumber(first[2]) - 1)
    end
  end
end
place = tonumber(ARGV[3]) >= BASE and string.format('%d', place) or ARGV[3]  -- a resubmit's place as it is
if redis.call('ZSCORE', KEYS[4], ARGV[2]) == false then
  redis.call('ZADD', KEYS[5], place, ARGV[2])
  redis.call('HSET', KEYS[6], ARGV[2], ARGV[4])
end
if redis.call('HGET', KEYS[2], ARGV[1]) == false then
  redis.call('HSET', KEYS[2], ARGV[1], 'order')
end
redis.call('ZADD', KEYS[1], 'LT', 0, ARGV[1])
return place
