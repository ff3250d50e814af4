-- One replica's record of its calls to an upstream, merged into the upstream's shared health (SPEC S10, the rule
-- of broker/upstreams/health.py `merge`): the latest answer wins, the latest failure wins, and a failure after the
-- latest answer is a streak that counts from its earliest known start (at the latest from that failure).
-- KEYS[1] the upstream's admission state hash (one key: the upstream's slot, {adm} or {adm:<name>})
-- ARGV[1] its latest answer (epoch ms, 0 = none)   ARGV[2] when its failures began (0 = its last call was answered)
-- ARGV[3] when its latest failed call began (0 = none)
-- Returns {answered, failing, failed} as stored after the merge (failing 0 = not failing)
local s = redis.call('HMGET', KEYS[1], 'answered', 'failing', 'failed')
local answered = math.max(tonumber(s[1] or '0') or 0, tonumber(ARGV[1]))
local failed = math.max(tonumber(s[3] or '0') or 0, tonumber(ARGV[3]))
local since = 0
for _, at in ipairs({tonumber(s[2] or '0') or 0, tonumber(ARGV[2])}) do
  if at > answered and (since == 0 or at < since) then
    since = at
  end
end
if since == 0 and failed > answered then
  since = failed
end
redis.call('HSET', KEYS[1], 'answered', answered, 'failing', since, 'failed', failed)
return {answered, since, failed}
