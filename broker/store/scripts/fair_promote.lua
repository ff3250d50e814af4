-- A key's next front joins its partition's line (SPEC S4.2 "What a turn costs"): the job fair_next.lua or
-- fair_settle.lua named moves from the parked jobs to the line at `band + tag`, its fronts entry (what a pass plans
-- its key by) is written, and every replica hears of it (`line J`, or `new S A J` at V: broker/store/signals.py).
-- Idempotent: a front in the line already moves to the score given when a settle places it (its key's corrected
-- turn), and its fronts entry is refreshed; a job in neither (claimed or stopped since) is not placed, and one whose
-- view is finished (an older replica's stop left it parked) leaves.
-- KEYS[1] partition line zset   KEYS[2] partition parked zset   KEYS[3] partition fronts hash   KEYS[4] job view
--   (one slot: the job's partition {pN})
-- ARGV[1] job   ARGV[2] its score (band + tag)   ARGV[3] its fronts entry `advance|key|more|next ids…`
-- ARGV[4] the signals channel   ARGV[5] the message   ARGV[6] a settle's: the message when it moves in the line
--   (`line J`); '' a pass's: a front in the line stays where it is   ARGV[7] a settle's: its key's settle count
--   (fair_settle.lua `seq`), kept as the front's `q:<job>`: the placing of an older settle, landing after a newer
--   one's, leaves the front where that one put it (absent: an older replica's, or a pass's)
-- Returns 1 when it joined the line, 2 when it was there, 0 when it is gone (the caller reports it: fair_next `left`)
local seq, settled = tonumber(ARGV[7] or ''), 'q:' .. ARGV[1]
local entry = {ARGV[1], ARGV[3]}  -- the fronts hash's fields of a placed front: its entry, and a settle's count
if seq then
  if seq < tonumber(redis.call('HGET', KEYS[3], settled) or '0') then return 2 end  -- a newer settle placed it
  entry[3], entry[4] = settled, ARGV[7]  -- as given: a number past 14 digits would be written rounded
end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  local ok, view = pcall(cjson.decode, redis.call('HGET', KEYS[4], 'state') or '')
  local status = ok and type(view) == 'table' and view.status
  if status == 'completed' or status == 'failed' or status == 'cancelled' then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('HDEL', KEYS[3], ARGV[1], settled)
    return 0
  end
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  redis.call('HSET', KEYS[3], unpack(entry))
  redis.call('PUBLISH', ARGV[4], ARGV[5])
  return 1
end
local place = redis.call('ZSCORE', KEYS[1], ARGV[1])
if place then
  if ARGV[6] ~= '' and tonumber(place) ~= tonumber(ARGV[2]) then  -- a settle moved it: the passes read its line
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
    redis.call('PUBLISH', ARGV[4], ARGV[6])
  end
  redis.call('HSET', KEYS[3], unpack(entry))
  return 2
end
redis.call('HDEL', KEYS[3], ARGV[1], settled)
return 0
