-- Reserve admission slots for the heads of the partition lines (SPEC S4.1): at most `limit` of the
-- broker's runs live on Hermes across replicas; while Hermes refuses, one probe at a time, not before
-- retry_at, and not while any create is in flight (its answer comes first). A reservation
-- `~<token>:<i>` counts against the limit until admission_grant.lua gives it to a job or gives it
-- back unused; one never settled (the caller died) expires by itself.
-- KEYS[1] admission state hash   KEYS[2] live zset (slot -> expiry)
-- KEYS[3] slots hash (job -> place, while its create is in flight)   KEYS[4] reserved zset
--   (one slot: the upstream's, {adm} for the first of HERMES_URL, {adm:<name>} for the others, SPEC S10)
-- ARGV[1] now (epoch ms)   ARGV[2] most slots the caller can use   ARGV[3] slot ttl ms (RUNS_LEASE)
-- ARGV[4] pinned limit (0 = learnt)   ARGV[5] a learnt limit's start   ARGV[6] reservation token
-- Returns {wake_at, v1, .., v5, limit, in_use, refusing, since, answered, failing, reservation1, ...}; wake_at (0:
-- none) is
-- when the next probe may go while Hermes refuses; v1..v5 the virtual time of each priority (SPEC S4.2, kept by
-- admission_grant.lua in the first upstream's state), which the replica's creates use; limit, in_use (live slots
-- and reservations before this one's), refusing (the reason, '' = none), since, answered and failing (when a call of
-- any replica last got an answer, and when the current streak of calls without one began; '' = never, 0 = not
-- failing; broker/upstreams/health.py): what routing reads (SPEC S10).
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[3])
for _, job in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  -- its holder stopped renewing (a dead replica): the slot comes back
  redis.call('ZREM', KEYS[2], job)
  redis.call('HDEL', KEYS[3], job)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local s = redis.call('HMGET', KEYS[1], 'limit', 'refusing', 'retry_at', 'v1', 'v2', 'v3', 'v4', 'v5', 'since', 'answered',
                        'failing')
local limit = tonumber(ARGV[4])
if limit == 0 then
  limit = tonumber(s[1] or ARGV[5])
end
local in_use = redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[4])
local n = math.min(tonumber(ARGV[2]), limit - in_use)
local reply = {0, s[4] or '0', s[5] or '0', s[6] or '0', s[7] or '0', s[8] or '0', limit, in_use, s[2] or '',
               s[9] or '0', s[10] or '', s[11] or ''}
local probe = false
if s[2] and s[2] ~= '' then
  if now < tonumber(s[3] or '0') then
    n, reply[1] = 0, tonumber(s[3])
  elseif redis.call('HLEN', KEYS[3]) > 0 or redis.call('ZCARD', KEYS[4]) > 0 then
    n = 0 -- a create is in flight (the probe, or one sent before the refusal), or about to be
  else
    n, probe = math.min(n, 1), true
  end
end
for i = 1, n do
  local reservation = '~' .. ARGV[6] .. ':' .. i
  redis.call('ZADD', KEYS[4], now + ttl, reservation)
  reply[#reply + 1] = reservation
end
if probe and #reply > 12 then
  -- counted as a probe once a job is granted the reservation (admission_grant.lua)
  redis.call('HSET', KEYS[1], 'probe', reply[13])
end
return reply
