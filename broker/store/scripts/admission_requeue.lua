-- Put a granted job back at its place in the line without a refusal (the caller could not use the
-- grant: another replica holds the job's lease, or this one is draining before Hermes answered).
-- KEYS[1] admission state hash   KEYS[2] line zset   KEYS[3] live zset   KEYS[4] slots hash  (one slot: {adm})
-- ARGV[1] job   ARGV[2] the job's place if its slot lost it
-- Returns 1
local place = redis.call('HGET', KEYS[4], ARGV[1]) or ARGV[2]
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[2], place, ARGV[1])
if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'probe', '')
end
return 1
