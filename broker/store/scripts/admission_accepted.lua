-- Hermes accepted a granted create: any refusal is over, and a learnt limit grows (SPEC S4.1) —
-- by one per accepted create below the known capacity (slow start), by one per quiet period past it.
-- The limit only grows while it is used up, so an idle broker never inflates it.
-- KEYS[1] admission state hash   KEYS[2] live zset   KEYS[3] slots hash
--   (one slot: the upstream's, {adm} for the first of HERMES_URL, {adm:<name>} for the others, SPEC S10)
-- ARGV[1] job   ARGV[2] now (epoch ms)   ARGV[3] pinned limit (0 = learnt)   ARGV[4] quiet ms
-- ARGV[5] a learnt limit's start   ARGV[6] slot ttl ms   ARGV[7] '0': the caller granted the slot less than half a
-- ttl ago (it is live, unexpired: not renewed here; absent or '1': renewed)
-- Returns {limit, 1 if the limit grew, 1 if this ended a refusal}
local job, now = ARGV[1], tonumber(ARGV[2])
if ARGV[7] ~= '0' then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), job)
end
redis.call('HDEL', KEYS[3], job) -- its create is no longer in flight
local s = redis.call('HMGET', KEYS[1], 'limit', 'ceiling', 'changed_at', 'refusing')
local ended = 0
if s[4] and s[4] ~= '' then
  redis.call('HSET', KEYS[1], 'refusing', '', 'streak', 0, 'probe', '')
  ended = 1
end
if ARGV[3] ~= '0' then
  return {tonumber(ARGV[3]), 0, ended}
end
local limit, ceiling = tonumber(s[1] or ARGV[5]), tonumber(s[2] or '0')
local grew = 0
if redis.call('ZCARD', KEYS[2]) >= limit then
  if ceiling == 0 or limit < ceiling then
    grew = 1
  elseif now - tonumber(s[3] or '0') >= tonumber(ARGV[4]) then
    grew = 1
    redis.call('HSET', KEYS[1], 'ceiling', limit + 1)
  end
  if grew == 1 then
    limit = limit + 1
    redis.call('HSET', KEYS[1], 'limit', limit, 'changed_at', now)
  end
end
return {limit, grew, ended}
