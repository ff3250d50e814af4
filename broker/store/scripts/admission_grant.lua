-- Give a reserved admission slot to the job the caller claimed off its partition's line
-- (admission_claim.lua); the job's place is kept for a later requeue. A probe reserved for the slot
-- becomes the job's (and is counted).
-- KEYS[1] admission state hash   KEYS[2] live zset   KEYS[3] slots hash   KEYS[4] reserved zset
--   (one slot: {adm})
-- ARGV[1] reservation   ARGV[2] job   ARGV[3] its place in the line   ARGV[4] now (epoch ms)
-- ARGV[5] slot ttl ms
-- Returns 1
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[2], tonumber(ARGV[4]) + tonumber(ARGV[5]), ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'probe', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'probes', 1)
end
return 1
