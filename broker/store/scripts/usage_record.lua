-- Count usage facts of one hour (SPEC S4.5), each at most once: a fact whose marker the hour has seen adds nothing,
-- so a fact read again (two replicas sweeping at once, a sweep cut short before it cleared its facts, a rebuild)
-- is counted once. The facts of one fairness key are summed here and its counters and ranking written once per call
-- (a sweep's batch holds many facts of few keys: one HGET, HSET and ZINCRBY per key, not per fact).
-- KEYS[1] the hour's counters hash (fairness key -> eight comma-joined counters)
-- KEYS[2] the hour's ranking zset (fairness key -> Hermes ms)   KEYS[3] the hour's markers set
--   (one slot: the three keys carry the hour's tag {u:H})
-- ARGV[1] when the hour's keys expire (epoch ms: the hour's end + RUNS_RETENTION)
-- ARGV[2..] per fact, ten values: marker, fairness key, then runs started, completed, failed, cancelled,
--   Hermes ms, input, output and total tokens
-- Returns the facts counted now, a list of 0 (seen before) and 1 (counted), in the order given.
local counted, sums, ms, order = {}, {}, {}, {}
for i = 2, #ARGV, 10 do
  if redis.call('SADD', KEYS[3], ARGV[i]) == 1 then
    local key = ARGV[i + 1]
    local values = sums[key]
    if not values then
      values = {}
      local old = redis.call('HGET', KEYS[1], key)
      if old then
        for number in string.gmatch(old, '[^,]+') do
          values[#values + 1] = tonumber(number)
        end
      end
      sums[key], ms[key], order[#order + 1] = values, 0, key
    end
    for j = 1, 8 do
      values[j] = (values[j] or 0) + tonumber(ARGV[i + 1 + j])
    end
    ms[key] = ms[key] + tonumber(ARGV[i + 6])
    counted[#counted + 1] = 1
  else
    counted[#counted + 1] = 0
  end
end
for _, key in ipairs(order) do
  local values = sums[key]
  for j = 1, 8 do
    values[j] = string.format('%.0f', values[j])
  end
  redis.call('HSET', KEYS[1], key, table.concat(values, ','))
  redis.call('ZINCRBY', KEYS[2], string.format('%.17g', ms[key]), key)
end
for k = 1, 3 do
  redis.call('PEXPIREAT', KEYS[k], ARGV[1])
end
return counted
