-- Grant admission slots to the head of the line (SPEC S4.1): at most `limit` of the broker's runs
-- live on Hermes across replicas; while Hermes refuses, one probe at a time, not before retry_at.
-- KEYS[1] admission state hash   KEYS[2] line zset   KEYS[3] live zset (slot -> expiry)
-- KEYS[4] slots hash (job -> place, while its create is in flight)   (all tagged {adm}: one slot)
-- ARGV[1] now (epoch ms)   ARGV[2] most slots the caller can use   ARGV[3] slot ttl ms (RUNS_LEASE)
-- ARGV[4] pinned limit (0 = learnt)   ARGV[5] a learnt limit's start
-- Returns {wake_at, job1, job2, ...}: the granted jobs, oldest first; wake_at (0 = none) is when the
-- next probe may go while Hermes refuses.
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[3])
for _, job in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  -- its holder stopped renewing (a dead replica): the slot comes back
  redis.call('ZREM', KEYS[3], job)
  redis.call('HDEL', KEYS[4], job)
end
local s = redis.call('HMGET', KEYS[1], 'limit', 'refusing', 'retry_at')
local limit = tonumber(ARGV[4])
if limit == 0 then
  limit = tonumber(s[1] or ARGV[5])
end
local n = math.min(tonumber(ARGV[2]), limit - redis.call('ZCARD', KEYS[3]))
local reply, probe = {0}, false
if s[2] and s[2] ~= '' then
  if now < tonumber(s[3] or '0') then
    n, reply[1] = 0, tonumber(s[3])
  elseif redis.call('HLEN', KEYS[4]) > 0 then
    n = 0 -- a create is in flight (the probe, or one sent before the refusal): its answer comes first
  else
    n, probe = math.min(n, 1), true
  end
end
if n <= 0 then
  return reply
end
local popped = redis.call('ZPOPMIN', KEYS[2], n)
for i = 1, #popped, 2 do
  redis.call('ZADD', KEYS[3], now + ttl, popped[i])
  redis.call('HSET', KEYS[4], popped[i], popped[i + 1])
  reply[#reply + 1] = popped[i]
end
if probe and #reply > 1 then
  redis.call('HSET', KEYS[1], 'probe', reply[2])
  redis.call('HINCRBY', KEYS[1], 'probes', 1)
end
return reply
