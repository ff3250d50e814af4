-- Replace a job's stored views with a rebuilt fold, only if no event was appended since the rebuild read.
-- KEYS[1] job view hash   KEYS[2] job board hash
-- ARGV[1] last id the rebuild folded up to   ARGV[2] job view JSON   ARGV[3] board state JSON ('' = none)
-- ARGV[4] latest board report ('' = leave the board hash alone)   ARGV[5] its version at
-- Returns 1 when replaced, 0 when the job moved on (or is gone).
if redis.call('HGET', KEYS[1], 'last_id') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'board', ARGV[3])
end
if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'latest', ARGV[4], 'latest_at', ARGV[5])
end
return 1
