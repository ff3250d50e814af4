-- Replace a job's stored projections with a fold rebuilt from its stream (SPEC S7), only if the job has
-- not moved on since the rebuild read it: the stream must still end at the id the fold reached and the
-- view must still hold the `last_id` the rebuild saw. A missing view or board hash is recreated with
-- the fields and expiries the job write (append_events.lua) gives them; the view expires with the stream.
-- KEYS[1] job events   KEYS[2] job view hash   KEYS[3] job board hash   KEYS[4] partition board outbox
-- KEYS[5] partition board due zset   KEYS[6] partition board index zset   (one slot: {pN})
-- ARGV[1]  the stream's last id the fold reached   ARGV[2] the view's last_id as read ('' = none)
-- ARGV[3]  job view JSON   ARGV[4] board state JSON ('' = no board)   ARGV[5] job id
-- ARGV[6]  latest board report ('' = leave the board hash alone)   ARGV[7] its version at
-- ARGV[8]  '1' = that version is a state change   ARGV[9] expire at (epoch ms)
-- ARGV[10] refresh interval ms   ARGV[11] now (epoch ms)
-- ARGV[12..] field, value pairs of the view hash's `run:<attempt>` fields (each accepted attempt's Hermes
--          run id, which packed entries leave out)
-- Returns 1 when replaced, 0 when the job moved on (or its stream is gone).
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #newest == 0 or newest[1][1] ~= ARGV[1] then
  return 0
end
if (redis.call('HGET', KEYS[2], 'last_id') or '') ~= ARGV[2] then
  return 0
end

redis.call('HSET', KEYS[2], 'state', ARGV[3], 'last_id', ARGV[1], unpack(ARGV, 12))
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], 'board', ARGV[4])
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
end

if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[3], 'latest', ARGV[6], 'latest_at', ARGV[7], 'expire_at', ARGV[9])
  -- Pending unless the receiver acknowledged this version already: a recreated hash (no ack known)
  -- is delivered again, which the receiver deduplicates on (key, at).
  if tonumber(ARGV[7]) > tonumber(redis.call('HGET', KEYS[3], 'acked_at') or '0') then
    redis.call('HSET', KEYS[3], 'pending_at', ARGV[7])
    if ARGV[8] == '1' then
      redis.call('HSET', KEYS[3], 'pending_change', '1')
    end
    local due = tonumber(redis.call('HGET', KEYS[3], 'delivered_ms') or '0') + tonumber(ARGV[10])
    if ARGV[8] == '1' or tonumber(ARGV[11]) >= due then
      redis.call('XADD', KEYS[4], 'MAXLEN', '~', 100000, '*', 'job', ARGV[5], 'at', ARGV[7])
    else
      redis.call('ZADD', KEYS[5], 'NX', due, ARGV[5])
    end
  end
  redis.call('PEXPIREAT', KEYS[3], ARGV[9])
  redis.call('ZADD', KEYS[6], ARGV[9], ARGV[5])
end
return 1
