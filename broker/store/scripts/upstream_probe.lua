-- Claim an upstream's health probe (SPEC S10: one probe at a time across the replicas while it fails or refuses):
-- granted when no probe is due later than now, and the next one is then not before `until`.
-- KEYS[1] the upstream's admission state hash (one key: the upstream's slot, {adm} or {adm:<name>})
-- ARGV[1] now (epoch ms)   ARGV[2] until (epoch ms): when the next probe may go
-- Returns 1 when this caller probes now, else 0
if tonumber(redis.call('HGET', KEYS[1], 'probe_at') or '0') > tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'probe_at', ARGV[2])
return 1
