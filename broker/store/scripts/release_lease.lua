-- Release a token-owned lease and set when the job is due again (or forget it, when finished).
-- KEYS[1] lease   KEYS[2] due zset   KEYS[3] work stream
-- ARGV[1] token   ARGV[2] job id   ARGV[3] due at (epoch ms; '' = finished: remove from due)
-- ARGV[4] '1' = enqueue on the work stream now (hand over at once)
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
if ARGV[4] == '1' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100000, '*', 'job', ARGV[2])
end
return 1
