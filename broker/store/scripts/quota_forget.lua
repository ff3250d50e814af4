-- Forget jobs of one fairness key that finished (stopped) or are gone while held or woken (SPEC S4.4), and make the
-- key due to be looked at now (its room may go to its next jobs).
-- KEYS[1] held-keys zset   KEYS[2] held count   KEYS[3] the key's held zset   KEYS[4] its woken zset
-- KEYS[5] (optional) the returned hash
--   (one slot: {quota})
-- ARGV[1] fairness key   ARGV[2..] jobs
-- Returns how many were held or woken.
local forgotten = 0
for i = 2, #ARGV do
  local held = redis.call('ZREM', KEYS[3], ARGV[i])
  if held == 1 then
    redis.call('DECR', KEYS[2])
  end
  forgotten = forgotten + held + redis.call('ZREM', KEYS[4], ARGV[i])
  if KEYS[5] then
    redis.call('HDEL', KEYS[5], ARGV[i])
  end
end
if forgotten > 0 then
  redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
end
return forgotten
