-- Renew a token-owned lease, and push the job's takeover deadline out with it.
-- KEYS[1] job lease   KEYS[2] partition due zset   (one slot: {pN})
-- ARGV[1] token   ARGV[2] lease ms   ARGV[3] job id   ARGV[4] takeover deadline (epoch ms)
-- Returns 1 when renewed, 0 when the lease belongs to someone else (or expired).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], 'XX', ARGV[4], ARGV[3])
return 1
