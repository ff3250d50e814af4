-- Take the jobs of one partition whose wake-up time has come, and push their wake-up out by a lease
-- so that no other replica promotes them again while one is taking them. The caller rings the work
-- doorbell for them (a lost doorbell only delays them: they are due again a lease later).
-- KEYS[1] partition due zset   (one slot: {pN})
-- ARGV[1] now (epoch ms)   ARGV[2] lease ms   ARGV[3] max jobs
-- Returns the promoted job ids.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local later = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, job in ipairs(due) do
  redis.call('ZADD', KEYS[1], later, job)
end
return due
