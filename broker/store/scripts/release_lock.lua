-- Release a token-owned lock: delete it only while it still holds our token (compare-and-delete),
-- so a holder whose lock expired never frees the lock of the replica that took it next.
-- KEYS[1] lock   (one key)
-- ARGV[1] token
-- Returns 1 when released, 0 when the lock was not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
