-- Check (and with ARGV[4] = '1' repair) one job's entries in the listing indexes (SPEC S3.9) against its
-- stored view, as the append script writes them; for scripts/rebuild_projections.py.
-- KEYS[1] job view hash   KEYS[2] partition listing index of every job   KEYS[3..] partition listing index
--   of each job status   (one slot: {pN})
-- ARGV[1] job id   ARGV[2] the view's updated_at ms   ARGV[3] the index key of the view's status (a KEYS[3..])
-- ARGV[4] '1' = repair, '0' = only check   ARGV[5] the stream id the view was folded up to
-- Returns 1 when the entries differed (and were repaired if asked), 0 when they are right, the job is gone
-- or it moved on since the fold (the append script then indexed it itself).
if redis.call('HGET', KEYS[1], 'last_id') ~= ARGV[5] then
  return 0
end
local repair = ARGV[4] == '1'
local score = tonumber(ARGV[2])
local differs = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '-1') ~= score
local target = nil
for i = 3, #KEYS do
  local found = redis.call('ZSCORE', KEYS[i], ARGV[1])
  if KEYS[i] == ARGV[3] then
    target = KEYS[i]
    differs = differs or tonumber(found or '-1') ~= score
  elseif found then
    differs = true
    if repair then
      redis.call('ZREM', KEYS[i], ARGV[1])
    end
  end
end
if not target then
  return redis.error_reply('index key ' .. ARGV[3] .. ' is not among KEYS')
end
if differs and repair then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  redis.call('ZADD', target, ARGV[2], ARGV[1])
end
return differs and 1 or 0
