-- Forget a partition's counts of waiting jobs per fairness key when its line is empty (SPEC S4.2): scripts
-- of an older broker move jobs without counting them, and this keeps such drift from lasting.
-- KEYS[1] partition line zset   KEYS[2] partition fair hash   KEYS[3] (optional) partition fair top zset
--   (one slot: {pN})
-- Returns 1 when the counts were cleared
if redis.call('ZCARD', KEYS[1]) == 0 then
  if KEYS[3] then
    redis.call('DEL', KEYS[3])
  end
  return redis.call('DEL', KEYS[2])
end
return 0
