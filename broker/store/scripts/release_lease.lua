-- Release a token-owned lease and set when the job is due again (or forget it, when finished).
-- A hand-over at once (shutdown) rings the work doorbell after this script.
-- KEYS[1] job lease   KEYS[2] partition due zset   (one slot: {pN})
-- ARGV[1] token   ARGV[2] job id   ARGV[3] due at (epoch ms; '' = finished: remove from due)
-- Returns 1 when released, 0 when the lease was not ours (nothing else changes then).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
else
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
end
return 1
