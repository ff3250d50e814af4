-- The earlier completed turns a turn with `session_history` sends to Hermes (SPEC S4.3): chosen at its first create
-- (the latest ARGV[2] of the session's history) and kept with the turn, so a resubmit sends the same ones.
-- KEYS[1] session state hash   KEYS[2] session history list   (one slot: {pN})
-- ARGV[1] job   ARGV[2] most turns
-- Returns the turns' job ids as a JSON array, oldest first
local chosen = redis.call('HGET', KEYS[1], 'h:' .. ARGV[1])
if chosen then
  return chosen
end
local turns = redis.call('LRANGE', KEYS[2], -tonumber(ARGV[2]), -1)
chosen = #turns == 0 and '[]' or cjson.encode(turns)
redis.call('HSET', KEYS[1], 'h:' .. ARGV[1], chosen)
return chosen
