-- Record the outcome of one callback delivery attempt (SPEC S5.8) and schedule the job's next one.
-- KEYS[1] job callback hash   KEYS[2] partition callbacks due zset (one slot: the partition tag {pN})
-- ARGV[1] job id   ARGV[2] webhook id   ARGV[3] outcome: 'delivered' (2xx), 'retry' (try again at ARGV[5]),
--   'failed' (the retry window is over: given up), 'gone' (410: no more callbacks for this job), 'idle' (no
--   attempt: the sender found nothing owed; the job leaves the schedule unless a write owed one since),
--   'defer' (no attempt: the receiver has as many deliveries in flight as a sender makes at once to one receiver;
--   the delivery counts one more deferral and the job is due again at ARGV[5])
-- ARGV[4] the attempt's error ('' = none)   ARGV[5] with 'retry' or 'defer': when (epoch ms)   ARGV[6] now (epoch ms)
-- Returns 1, or 0 when the hash is gone (expired: the job leaves the schedule).
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
local id, outcome, due = ARGV[2], ARGV[3], ARGV[6]
if outcome == 'defer' then  -- as 'idle', due at ARGV[5]
  if redis.call('HEXISTS', KEYS[1], 'b:' .. id) == 1 then
    redis.call('HINCRBY', KEYS[1], 'd:' .. id, 1)
  end
  outcome, due = 'idle', ARGV[5]
end
if outcome == 'idle' then
  if (redis.call('HGET', KEYS[1], 'queue') or '') == '' then
    redis.call('ZREM', KEYS[2], ARGV[1])
  else
    redis.call('ZADD', KEYS[2], due, ARGV[1])
  end
  return 1
end
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'last_error', ARGV[4])
end
if outcome == 'gone' then
  local owed = {}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    local kind = string.sub(field, 1, 2)
    if kind == 'b:' or kind == 's:' or kind == 't:' or kind == 'd:' then
      owed[#owed + 1] = field
    end
  end
  if #owed > 0 then
    redis.call('HDEL', KEYS[1], unpack(owed))
  end
  redis.call('HSET', KEYS[1], 'status', 'gone', 'queue', '')
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 1
end
if outcome == 'retry' and redis.call('HEXISTS', KEYS[1], 'b:' .. id) == 1 then
  redis.call('HINCRBY', KEYS[1], 't:' .. id, 1)
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
  return 1
end
-- delivered or given up (or delivered meanwhile by another sender): the delivery leaves the queue. An outcome
-- for a delivery no longer owed (another sender's attempt ended it first) changes no status: a late give-up
-- never marks failed what a receiver acknowledged.
local owed_still = redis.call('HEXISTS', KEYS[1], 'b:' .. id) == 1
local rest = {}
for owed in string.gmatch(redis.call('HGET', KEYS[1], 'queue') or '', '%S+') do
  if owed ~= id then
    rest[#rest + 1] = owed
  end
end
redis.call('HDEL', KEYS[1], 'b:' .. id, 's:' .. id, 't:' .. id, 'd:' .. id)
local queue = table.concat(rest, ' ')
redis.call('HSET', KEYS[1], 'queue', queue)
if outcome == 'failed' and owed_still then
  redis.call('HSET', KEYS[1], 'status', 'failed')
elseif outcome == 'delivered' and queue == '' and redis.call('HGET', KEYS[1], 'status') ~= 'failed' then
  redis.call('HSET', KEYS[1], 'status', 'delivered')
end
if queue ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
