-- Free a granted job's slot without a refusal (the caller could not use the grant: another replica
-- holds the job's lease, or this one is draining before Hermes answered); the caller puts the job back
-- at the returned place of its partition's line.
-- KEYS[1] admission state hash   KEYS[2] live zset   KEYS[3] slots hash
--   (one slot: the upstream's, {adm} for the first of HERMES_URL, {adm:<name>} for the others, SPEC S10)
-- ARGV[1] job   ARGV[2] the job's place if its slot lost it
-- Returns the job's place
local place = redis.call('HGET', KEYS[3], ARGV[1]) or ARGV[2]
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'probe', '')
end
return place
