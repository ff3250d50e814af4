-- Claim a partition's due callback deliveries (SPEC S5.8): each job whose delivery is due moves `lease` ms
-- ahead in the schedule, so no other sender takes it meanwhile and, if its claimer dies, any sender does after.
-- KEYS[1] partition callbacks due zset (one key, one slot: the partition tag {pN})
-- ARGV[1] now (epoch ms)   ARGV[2] lease (ms)   ARGV[3] most jobs to claim
-- Returns the claimed job ids, soonest due first.
local jobs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local until_ms = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, job in ipairs(jobs) do
  redis.call('ZADD', KEYS[1], until_ms, job)
end
return jobs
