-- A new job's start tag in its fairness key's turn (SPEC S4.2, start-time fair queuing; the same numbers as
-- broker/admission/fair.py `start`): S = max(F, V), and the key's next turn F becomes S + the job's advance.
-- Run before the job write (the key's turns live in the key's partition, the job in its own). Turns at or
-- below V are dropped: a key without a turn starts at V, as one at or below it would, so the set holds only
-- keys that are ahead of the line's virtual time.
-- KEYS[1] the turns zset of the job's priority in the key's partition   (one key)
-- ARGV[1] fairness key   ARGV[2] V, the priority's virtual time (tag units)   ARGV[3] the job's advance
-- ARGV[4] the largest tag
-- Returns S (an integer, as a string)
local v, most = tonumber(ARGV[2]), tonumber(ARGV[4])
local s = math.min(math.max(tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0'), v), most)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', v))
redis.call('ZADD', KEYS[1], string.format('%.0f', math.min(s + tonumber(ARGV[3]), most)), ARGV[1])
return string.format('%.0f', s)
