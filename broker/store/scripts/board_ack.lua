-- Acknowledge one delivered board version (SPEC S5.3): a 2xx clears the pending delivery only when
-- it is exactly that version, so an ack never clears a newer pending version persisted meanwhile.
-- The acknowledgement and the delivery time are recorded either way (the refresh interval counts
-- from the key's previous delivery). An expired hash is not recreated.
-- KEYS[1] job board hash   (one key)
-- ARGV[1] delivered version `at`   ARGV[2] now (epoch ms)
-- Returns 1 when the pending version was cleared, 0 otherwise, -1 when the hash is gone.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local cleared = 0
if redis.call('HGET', KEYS[1], 'pending_at') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'pending_at', 'pending_change')
  cleared = 1
end
local acked = tonumber(redis.call('HGET', KEYS[1], 'acked_at') or '0')
if tonumber(ARGV[1]) > acked then
  redis.call('HSET', KEYS[1], 'acked_at', ARGV[1])
end
redis.call('HSET', KEYS[1], 'delivered_ms', ARGV[2])
return cleared
