-- A job gives its admission slot up. `freed`: one of the broker's runs settled, so a refusal seen
-- before it is over (the slot it frees is newer than the refusal) and the next job goes at once.
-- KEYS[1] admission state hash   KEYS[2] live zset   KEYS[3] slots hash
--   (one slot: the upstream's, {adm} for the first of HERMES_URL, {adm:<name>} for the others, SPEC S10)
-- ARGV[1] job   ARGV[2] '1' = freed by a settled run   ARGV[3] '0': the caller wrote the job's acceptance (no create
-- in flight: the slots hash does not hold it; absent or '1': it may)
-- Returns {1 if the job held a slot, 1 if this ended a refusal}
local held = redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[3] ~= '0' then
  redis.call('HDEL', KEYS[3], ARGV[1])
end
local ended = 0
if held == 1 and ARGV[2] == '1' then
  local refusing = redis.call('HGET', KEYS[1], 'refusing')
  if refusing and refusing ~= '' then
    redis.call('HSET', KEYS[1], 'refusing', '', 'streak', 0, 'probe', '')
    ended = 1
  end
end
return {held, ended}
