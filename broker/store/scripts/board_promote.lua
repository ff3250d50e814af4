-- Move board keys whose coalesced refresh is due onto the board outbox, once: the entry leaves the
-- due set in the same step, so no other replica promotes it again. The sender re-reads the key's
-- hash and schedules it again when its refresh is not due after all (a delivery happened meanwhile).
-- KEYS[1] partition board due zset   KEYS[2] partition board outbox stream   (one slot: {pN})
-- ARGV[1] now (epoch ms)   ARGV[2] max keys
-- Returns the promoted job ids.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, job in ipairs(due) do
  redis.call('ZREM', KEYS[1], job)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100000, '*', 'job', job, 'at', '')
end
return due
