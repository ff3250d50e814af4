-- Remove a finished job's message.delta entries once RUNS_DELTA_RETENTION has passed since it ended
-- (SPEC S3.6), one bounded slice per call: every other entry keeps its id and the stream its last id, and the
-- room is given back. XDEL alone leaves deleted entries inside nodes that still hold others, so the stream is
-- rebuilt beside itself: each call copies the entries that are no delta of the next ARGV[5] (KEYS[4], under their
-- own ids) and records how far it read in the view hash (`deltas_at`); the call that reaches the end gives the
-- copy the stream's last id and TTL and copies it over the stream (COPY leaves no reserve at its end). Readers
-- see the whole stream until then, and the copy after: never a part. The job stays in the schedule until that
-- last call, so a crash leaves a copy (with the stream's TTL) that a later sweep carries on; a job that is no
-- longer due (another replica finished it, or an older broker's script removed them in one call) drops the copy.
-- KEYS[1] job events   KEYS[2] job view hash   KEYS[3] partition delta schedule zset
-- KEYS[4] job compact stream (the copy being built)   (one slot: {pN})
-- ARGV[1] job id   ARGV[2] now (epoch ms)   ARGV[3] the view JSON without its output ('' = keep the view)
-- ARGV[4] SHA-1 of the view JSON ARGV[3] was made from: with it still in `state` and the output of the kept
--   JobFinished entry equal to the view's, the view hash keeps `lean` = ARGV[3] and `output_at` = that entry's id
--   instead of `state` (broker/store/lean.py)
-- ARGV[5] entries read per call
-- Returns the number of entries removed (the last call); -2 when a slice was copied and more follow; -1 when the
-- job is not due (another replica finished it, or later).
local due = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[4])
  redis.call('HDEL', KEYS[2], 'deltas_at')
  return -1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('DEL', KEYS[4])
  return 0 -- expired meanwhile
end

-- A packed delta is `[attempt,1,` or `[attempt,"message.delta",` (broker/codec.py); a full one a
-- HermesEventRecorded named message.delta. Anything unreadable is kept.
local function delta(fields)
  local value = fields[2]
  if fields[1] ~= 'e' or #fields ~= 2 then
    return false
  end
  if string.find(value, '^%[%d+,1,') or string.find(value, '^%[%d+,"message%.delta",') then
    return true
  end
  if string.sub(value, 1, 1) ~= '{' then
    return false
  end
  local ok, event = pcall(cjson.decode, value)
  return ok and type(event) == 'table' and event.type == 'HermesEventRecorded' and event.name == 'message.delta'
end

local at = redis.call('HGET', KEYS[2], 'deltas_at')
if not at then
  redis.call('DEL', KEYS[4]) -- a copy whose progress the view no longer records (a rebuild replaced it): anew
end
local count = tonumber(ARGV[5])
local entries = redis.call('XRANGE', KEYS[1], at and '(' .. at or '-', '+', 'COUNT', count)
for _, entry in ipairs(entries) do
  if not delta(entry[2]) then
    redis.call('XADD', KEYS[4], entry[1], unpack(entry[2]))
  end
end
if #entries == count then
  redis.call('HSET', KEYS[2], 'deltas_at', entries[#entries][1])
  if ttl > 0 and redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('PEXPIRE', KEYS[4], ttl)
  end
  return -2
end

-- The end: the copy holds every entry that is no delta
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[2], 'deltas_at')
local kept = redis.call('XLEN', KEYS[4])
local removed = redis.call('XLEN', KEYS[1]) - kept
-- The entry that holds the output the view holds too: then the view need not keep a copy of it
local function holding(output)
  for _, entry in ipairs(redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 100)) do
    local value = entry[2][2]
    if entry[2][1] == 'e' and string.find(value, '"type":"JobFinished"', 1, true) then
      local ok, event = pcall(cjson.decode, value)
      return ok and type(event) == 'table' and event.output == output and entry[1] or nil
    end
  end
  return nil
end
local state = ARGV[3] ~= '' and redis.call('HGET', KEYS[2], 'state')
if state and redis.sha1hex(state) == ARGV[4] then
  local ok, view = pcall(cjson.decode, state)
  local output_at = ok and type(view) == 'table' and type(view.output) == 'string' and holding(view.output)
  if output_at then
    redis.call('HSET', KEYS[2], 'lean', ARGV[3], 'output_at', output_at)
    redis.call('HDEL', KEYS[2], 'state')
  end
end
if removed == 0 or kept == 0 then
  redis.call('DEL', KEYS[4])
  return 0
end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then
    redis.call('XSETID', KEYS[4], info[i + 1])
  end
end
redis.call('COPY', KEYS[4], KEYS[1], 'REPLACE')
redis.call('DEL', KEYS[4])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('PERSIST', KEYS[1])
end
-- the view counted them (RUNS_EVENTS_MAXLEN); the rebuild adds them back to its fold (broker/rebuild.py)
redis.call('HINCRBY', KEYS[2], 'deltas_removed', removed)
return removed
