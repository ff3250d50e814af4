-- Create a job unless it exists: the atomic claim of an Idempotency-Key (the job id is
-- derived from the key, so "exists" means "claimed").
-- KEYS[1] job events stream   KEYS[2] job view hash   KEYS[3] work stream   KEYS[4] due zset
-- ARGV[1] JobCreated JSON     ARGV[2] job view JSON    ARGV[3] retention ms   ARGV[4] job id
-- ARGV[5] takeover deadline: when the job is promoted again if no replica has taken it (epoch ms)
-- Returns {0, existing view JSON} when the job exists, else {1, stream id of JobCreated}.
local existing = redis.call('HGET', KEYS[2], 'state')
if existing then
  return {0, existing}
end
local id = redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
redis.call('HSET', KEYS[2], 'state', ARGV[2], 'last_id', id)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100000, '*', 'job', ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[4])
return {1, id}
