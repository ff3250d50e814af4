-- The one write of a job: append events, store the views folded up to the last of them, renew
-- retention, and persist the board projection with its pending delivery (SPEC S3.6, S5.3), atomically.
-- KEYS[1] job events   KEYS[2] job view hash   KEYS[3] job lease   KEYS[4] work stream   KEYS[5] due zset
-- KEYS[6] job board hash   KEYS[7] board outbox   KEYS[8] board due zset   KEYS[9] board index zset
-- ARGV[1]  expected last id: '' = do not check, '$new' = create: only if the job does not exist
-- ARGV[2]  lease token ('' = not fenced)   ARGV[3] retention ms   ARGV[4] job view JSON
-- ARGV[5]  job id   ARGV[6] '1' = ring the work stream   ARGV[7] due at ('' = leave the schedule alone)
-- ARGV[8]  board state JSON ('' = no board)   ARGV[9] board report ('' = no new version)
-- ARGV[10] version at   ARGV[11] '1' = state change   ARGV[12] expire at (epoch ms)
-- ARGV[13] refresh interval ms   ARGV[14] now (epoch ms)   ARGV[15] event count   ARGV[16..] event JSONs
-- Returns {'OK', id1, ...} | {'EXISTS', view JSON} | {'MISSING'} | {'FENCED'} | {'CONFLICT', actual last id}
if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return {'FENCED'}
end
local last = redis.call('HGET', KEYS[2], 'last_id')
if ARGV[1] == '$new' then
  if last then
    return {'EXISTS', redis.call('HGET', KEYS[2], 'state')}
  end
elseif not last then
  return {'MISSING'}
elseif ARGV[1] ~= '' and last ~= ARGV[1] then
  return {'CONFLICT', last}
end

local reply = {'OK'}
for i = 16, 15 + tonumber(ARGV[15]) do
  last = redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
  reply[#reply + 1] = last
end
redis.call('HSET', KEYS[2], 'state', ARGV[4], 'last_id', last)
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[2], 'board', ARGV[8])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if ARGV[6] == '1' then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', 100000, '*', 'job', ARGV[5])
end
if ARGV[7] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[7], ARGV[5])
end

if ARGV[9] ~= '' then
  -- A new immutable board version: it is the latest and pending; state changes go out at once,
  -- activity-only versions at most once per refresh interval after the key's previous delivery.
  redis.call('HSET', KEYS[6], 'latest', ARGV[9], 'latest_at', ARGV[10], 'pending_at', ARGV[10],
             'expire_at', ARGV[12])
  if ARGV[11] == '1' then
    redis.call('HSET', KEYS[6], 'pending_change', '1')
  end
  redis.call('PEXPIREAT', KEYS[6], ARGV[12])
  redis.call('ZADD', KEYS[9], ARGV[12], ARGV[5])
  local delivered = tonumber(redis.call('HGET', KEYS[6], 'delivered_ms') or '0')
  local due = delivered + tonumber(ARGV[13])
  if ARGV[11] == '1' or tonumber(ARGV[14]) >= due then
    redis.call('XADD', KEYS[7], 'MAXLEN', '~', 100000, '*', 'job', ARGV[5], 'at', ARGV[10])
  else
    redis.call('ZADD', KEYS[8], 'NX', due, ARGV[5])
  end
end
return reply
