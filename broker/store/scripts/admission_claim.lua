-- Take a job off its partition's admission line together with its run lease, and make it due for
-- takeover when the lease would lapse (as acquire_lease.lua does), atomically: a crash after this loses
-- nothing (the job is taken over); another replica holding the lease leaves the job in the line. The
-- job's stored view and its JobCreated (the stream's first entry: the execution body) come back with the
-- claim, so its runner starts without reading them again. A job of a priority band (a score >= 2^51) leaves its
-- fairness key's count of waiting jobs (SPEC S4.2; the key is in its view JSON).
-- KEYS[1] partition line zset   KEYS[2] job lease   KEYS[3] partition due zset   KEYS[4] job view hash
-- KEYS[5] job events   KEYS[6] partition fair hash   KEYS[7] (optional) partition fair top zset, the key's
--   count mirrored there   KEYS[8], KEYS[9] (optional, with KEYS[7]: ADMISSION_FAIRNESS_COST time or tokens) partition
--   parked zset and fronts hash: a job not in the line is taken from the parked jobs (a key's next job a pass
--   planned behind its front, SPEC S4.2 "What a turn costs"), and a front's entry goes with it   (one slot: {pN})
-- ARGV[1] job   ARGV[2] lease token   ARGV[3] lease ms   ARGV[4] takeover deadline (epoch ms)
-- Returns {1, place, view state, last id, board fold state, JobCreated JSON} when claimed (false for a
-- field the view hash lacks, or no stream); {0} when the job is not in the line (nor parked) any more; {-1} when
-- another holder has its lease (the job stays in the line).
local from = KEYS[1]
local place = redis.call('ZSCORE', from, ARGV[1])
if not place and KEYS[8] then
  from = KEYS[8]
  place = redis.call('ZSCORE', from, ARGV[1])
end
if not place then
  return {0}
end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then
  return {-1}
end
redis.call('ZREM', from, ARGV[1])
if KEYS[9] then
  redis.call('HDEL', KEYS[9], ARGV[1], 'q:' .. ARGV[1])
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
local view = redis.call('HMGET', KEYS[4], 'state', 'last_id', 'board')
if KEYS[6] and tonumber(place) >= 2 ^ 51 then
  local ok, state = pcall(cjson.decode, view[1] or '')
  local s = ok and type(state) == 'table' and state.scheduling
  local key = type(s) == 'table' and type(s.fairness_key) == 'string' and s.fairness_key or ''
  local n = redis.call('HINCRBY', KEYS[6], 'n:' .. key, -1)
  if n <= 0 then
    redis.call('HDEL', KEYS[6], 'n:' .. key, 'w:' .. key)
    if KEYS[7] then
      redis.call('ZREM', KEYS[7], key)
    end
  elseif KEYS[7] then
    redis.call('ZADD', KEYS[7], n, key)
  end
end
local first = redis.call('XRANGE', KEYS[5], '-', '+', 'COUNT', 1)[1]
return {1, place, view[1], view[2], view[3], first and first[2][2] or false}
