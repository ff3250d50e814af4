-- Forget a partition's counts of waiting jobs per fairness key when its line is empty (SPEC S4.2): scripts
-- of an older broker move jobs without counting them, and this keeps such drift from lasting.
-- KEYS[1] partition line zset   KEYS[2] partition fair hash   KEYS[3] (optional) partition fair top zset
-- KEYS[4] (optional, with KEYS[3]) partition parked zset: its jobs are counted too (SPEC S4.2 "What a turn costs"),
--   so the counts stay while any is parked   (one slot: {pN})
-- Returns 1 when the counts were cleared
if redis.call('ZCARD', KEYS[1]) == 0 and (not KEYS[4] or redis.call('ZCARD', KEYS[4]) == 0) then
  if KEYS[3] then
    redis.call('DEL', KEYS[3])
  end
  return redis.call('DEL', KEYS[2])
end
return 0
