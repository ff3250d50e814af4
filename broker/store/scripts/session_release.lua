-- A turn of an ordered session ended (SPEC S4.3): it leaves the session's line. When it held the session, the next
-- turn gets it now; if that turn was parked, its place in the admission line comes back, for the caller to put it
-- there (it stays parked until its own check finds it holds the session, so a crash before that loses nothing).
-- A completed turn is kept in the session's history (its job id; at most ARGV[5] of the latest), which a later turn
-- with `session_history` sends to Hermes (session_history.lua).
-- KEYS[1] session turns zset   KEYS[2] session state hash   KEYS[3] partition sessions hash
-- KEYS[4] session history list   (one slot: {pN})
-- ARGV[1] job   ARGV[2] now (epoch ms)   ARGV[3] retention ms (of the history; the turns have no TTL)
-- ARGV[4] '1': the turn completed
-- ARGV[5] most turns the history keeps
-- Returns {}: nothing changed hands; {next, place}: `next` holds the session now ('' place: it was not parked)
local job = ARGV[1]
local holder = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if redis.call('ZREM', KEYS[1], job) == 0 then
  return {}
end
if redis.call('HDEL', KEYS[2], 'p:' .. job) == 1 then
  redis.call('HINCRBY', KEYS[3], 'waiting', -1)
end
redis.call('HDEL', KEYS[2], 'h:' .. job, 'c:' .. job)
if ARGV[4] == '1' then
  redis.call('RPUSH', KEYS[4], job)
  redis.call('LTRIM', KEYS[4], -tonumber(ARGV[5]), -1)
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
end
local next = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if not next then
  redis.call('DEL', KEYS[1], KEYS[2])
  return {}
end
if next == holder then
  return {}
end
redis.call('HSET', KEYS[2], 'since', ARGV[2])
return {next, redis.call('HGET', KEYS[2], 'p:' .. next) or ''}
