-- Put a waiting job back in its partition's admission line at `place` unless it is there (SPEC S4.1: a job
-- of an older broker, one a refusal or a requeue hands back, or after a lost write), and count it among its
-- fairness key's waiting jobs (SPEC S4.2; the key is in its view JSON) when it was not there and its place is in
-- a priority band (>= 2^51).
-- KEYS[1] partition line zset   KEYS[2] job view hash   KEYS[3] partition fair hash
-- KEYS[4] (optional) partition fair top zset, the key's count mirrored there   (one slot: {pN})
-- ARGV[1] job   ARGV[2] place (its score)
-- Returns 1 when the job entered the line, 0 when it was there
if redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1]) == 0 then
  return 0
end
if tonumber(ARGV[2]) >= 2 ^ 51 then
  local ok, view = pcall(cjson.decode, redis.call('HGET', KEYS[2], 'state') or '')
  local s = ok and type(view) == 'table' and view.scheduling
  s = type(s) == 'table' and s or {}
  local key = type(s.fairness_key) == 'string' and s.fairness_key or ''
  local n = redis.call('HINCRBY', KEYS[3], 'n:' .. key, 1)
  if KEYS[4] then
    redis.call('ZADD', KEYS[4], n, key)
  end
  redis.call('HSET', KEYS[3], 'w:' .. key, tostring(tonumber(s.fairness_weight) or 1))
end
return 1
