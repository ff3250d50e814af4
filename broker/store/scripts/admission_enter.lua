-- Put a waiting job back in its partition's admission line at `place` unless it is there (SPEC S4.1: a job
-- of an older broker, one a refusal or a requeue hands back, a held job its key's quota sends back (S4.4), or after
-- a lost write), and count it among its fairness key's waiting jobs (SPEC S4.2; the key is in its view JSON) when it
-- was not there and its place is in a priority band (>= 2^51).
-- With `woken` (a job a quota sends back, KEYS[5] given): only a job that still waits for a run enters: none whose
-- view is gone or finished (-1: forget it), none that a replica drives now (-2: its lease is held).
-- KEYS[1] partition line zset   KEYS[2] job view hash   KEYS[3] partition fair hash
-- KEYS[4] (optional) partition fair top zset, the key's count mirrored there   KEYS[5] (with `woken`) job lease
--   (one slot: {pN})
-- ARGV[1] job   ARGV[2] place (its score)   ARGV[3] (optional) `woken`
-- Returns 1 when the job entered the line, 0 when it was there, -1 / -2 as above
local state = nil
if ARGV[3] == 'woken' then
  state = redis.call('HGET', KEYS[2], 'state')
  if not state then
    return -1
  end
  local ok, view = pcall(cjson.decode, state)
  local status = ok and type(view) == 'table' and view.status
  if status == 'completed' or status == 'failed' or status == 'cancelled' then
    return -1
  end
  if redis.call('EXISTS', KEYS[5]) == 1 then
    return -2
  end
end
if redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1]) == 0 then
  return 0
end
if tonumber(ARGV[2]) >= 2 ^ 51 then
  local ok, view = pcall(cjson.decode, state or redis.call('HGET', KEYS[2], 'state') or '')
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
