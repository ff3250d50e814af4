-- A turn of an ordered session (SPEC S4.3) takes its place in the session's line, and learns whether it holds the
-- session: the first turn does. `join` (its create, once stored) only takes the place; `reject` (a create with
-- multitask reject, before it stores anything) takes it only when nobody holds the session, marking the turn as on
-- its way (`c:<job>`, cleared by its `join`); `check` (its runner, before it asks Hermes) also parks a turn that
-- does not hold the session: where it left the admission line is kept until its turn, when the release of the turn
-- before it puts it back there. A turn joins once: its place never changes. The session's keys have no TTL: they
-- go when its last turn ends (a live turn's session never expires).
-- KEYS[1] session turns zset   KEYS[2] session state hash   KEYS[3] partition sessions hash   (one slot: {pN})
-- ARGV[1] job   ARGV[2] now (epoch ms)   ARGV[3] 'join' | 'reject' | 'check'   ARGV[4] with check: its place in
-- the line
-- Returns {1, since}: it holds the session since then; {0, holder, turns ahead of it}; {2, holder}: `reject` and
-- the session is held (nothing written)
local job = ARGV[1]
if not redis.call('ZSCORE', KEYS[1], job) then
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if ARGV[3] == 'reject' and last[1] then
    return {2, redis.call('ZRANGE', KEYS[1], 0, 0)[1]}
  end
  redis.call('ZADD', KEYS[1], (tonumber(last[2]) or 0) + 1, job)
  if ARGV[3] == 'reject' then
    redis.call('HSET', KEYS[2], 'c:' .. job, ARGV[2])
  end
elseif ARGV[3] == 'join' then
  redis.call('HDEL', KEYS[2], 'c:' .. job)
end
local holder = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if holder == job then
  if redis.call('HDEL', KEYS[2], 'p:' .. job) == 1 then
    redis.call('HINCRBY', KEYS[3], 'waiting', -1)
  end
  local since = redis.call('HGET', KEYS[2], 'since')
  if not since then
    since = ARGV[2]
    redis.call('HSET', KEYS[2], 'since', since)
  end
  return {1, since}
end
if ARGV[3] == 'check' and redis.call('HSETNX', KEYS[2], 'p:' .. job, ARGV[4]) == 1 then
  redis.call('HINCRBY', KEYS[3], 'waiting', 1)
end
return {0, holder, redis.call('ZRANK', KEYS[1], job)}
