-- Move jobs whose wake-up time has come onto the work stream, and push their wake-up out by a
-- lease so that no other replica promotes them again while one is taking them.
-- KEYS[1] due zset   KEYS[2] work stream
-- ARGV[1] now (epoch ms)   ARGV[2] lease ms   ARGV[3] max jobs
-- Returns the promoted job ids.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local later = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, job in ipairs(due) do
  redis.call('ZADD', KEYS[1], later, job)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100000, '*', 'job', job)
end
return due
