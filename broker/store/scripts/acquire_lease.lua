-- Take a job's run lease if nobody holds it, and make the job due for takeover when the lease
-- would lapse, so a holder that dies before its first renewal is still taken over (RUNS_LEASE).
-- KEYS[1] lease   KEYS[2] due zset
-- ARGV[1] token   ARGV[2] lease ms   ARGV[3] job id   ARGV[4] takeover deadline (epoch ms)
-- Returns 1 when acquired, 0 when another holder has it (nothing changes then).
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
return 1
