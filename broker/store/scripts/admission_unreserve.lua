-- Give back reserved admission slots the caller found no job for (the lines were shorter, or other
-- replicas claimed their heads first). A probe reserved for one of them is over.
-- KEYS[1] admission state hash   KEYS[2] reserved zset   (one slot: {adm})
-- ARGV[1..] reservations
-- Returns the number given back
local probe, n = redis.call('HGET', KEYS[1], 'probe'), 0
for _, reservation in ipairs(ARGV) do
  n = n + redis.call('ZREM', KEYS[2], reservation)
  if probe == reservation then
    redis.call('HSET', KEYS[1], 'probe', '')
  end
end
return n
