-- What observers see of one partition's line (SPEC S3.8 /readyz, S4.2), read in one call whatever the number
-- of fairness keys: its waiting jobs ahead of the bands and in each priority band, its due jobs, its oldest
-- queued job, and its keys with most waiting jobs. Those come from the fair hash itself while it holds at most
-- ARGV[1] keys (then the list is complete), else from the top zset's first ARGV[1] keys, whose counts and weights
-- are read back from the hash: the hash is what every broker version counts in, the zset only orders (a key the
-- hash no longer has is left out). Reads only.
-- KEYS[1] partition line zset   KEYS[2] partition fair hash   KEYS[3] partition fair top zset
-- KEYS[4] partition listing index of queued jobs   KEYS[5] partition due zset
-- KEYS[6] partition sessions hash (its `waiting`: turns waiting for their session, SPEC S4.3)
-- KEYS[7] (optional) partition parked zset: its jobs wait too and count as the line's (SPEC S4.2 "What a turn
--   costs": a key's jobs behind its front)   (one slot: {pN})
-- ARGV[1] most keys listed   ARGV[2..] min, max score pairs of the line to count (ahead, then each band)
-- Returns {count per pair..., due jobs, oldest queued score or '', turns waiting for their session, complete (1:
-- every key of the hash is listed), key, count, weight, ...}
local reply = {}
local parked = KEYS[7] and redis.call('EXISTS', KEYS[7]) == 1
for i = 2, #ARGV, 2 do
  local n = redis.call('ZCOUNT', KEYS[1], ARGV[i], ARGV[i + 1])
  if parked then
    n = n + redis.call('ZCOUNT', KEYS[7], ARGV[i], ARGV[i + 1])
  end
  reply[#reply + 1] = n
end
reply[#reply + 1] = redis.call('ZCARD', KEYS[5])
local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
reply[#reply + 1] = oldest[2] or ''
reply[#reply + 1] = tonumber(redis.call('HGET', KEYS[6], 'waiting') or '0')
local most = tonumber(ARGV[1])
if redis.call('HLEN', KEYS[2]) <= 2 * most then
  reply[#reply + 1] = 1
  local counted = redis.call('HGETALL', KEYS[2])
  local weights = {}
  for i = 1, #counted, 2 do
    if string.sub(counted[i], 1, 2) == 'w:' then
      weights[string.sub(counted[i], 3)] = counted[i + 1]
    end
  end
  for i = 1, #counted, 2 do
    if string.sub(counted[i], 1, 2) == 'n:' then
      local key = string.sub(counted[i], 3)
      reply[#reply + 1] = key
      reply[#reply + 1] = counted[i + 1]
      reply[#reply + 1] = weights[key] or '1'
    end
  end
  return reply
end
reply[#reply + 1] = 0
local top = redis.call('ZREVRANGE', KEYS[3], 0, most - 1)
if #top == 0 then
  return reply
end
local fields = {}
for _, key in ipairs(top) do
  fields[#fields + 1] = 'n:' .. key
  fields[#fields + 1] = 'w:' .. key
end
local read = redis.call('HMGET', KEYS[2], unpack(fields))
for i, key in ipairs(top) do
  local n = read[2 * i - 1]
  if n then
    reply[#reply + 1] = key
    reply[#reply + 1] = n
    reply[#reply + 1] = read[2 * i] or '1'
  end
end
return reply
