-- Remove a finished job's message.delta entries once RUNS_DELTA_RETENTION has passed since it ended
-- (SPEC S3.6): every other entry keeps its id and the stream its last id, and the room is given back.
-- XDEL alone leaves deleted entries inside nodes that still hold others (and COPY copies them), so the
-- stream is rewritten: its remaining entries re-added under their own ids, its last id and TTL restored,
-- then copied and renamed over itself as the terminal write does (no reserve at its end). Atomic, so a
-- reader sees the stream before or after, never between.
-- KEYS[1] job events   KEYS[2] job view hash   KEYS[3] partition delta schedule zset
-- KEYS[4] partition scratch key   (one slot: {pN})
-- ARGV[1] job id   ARGV[2] now (epoch ms)
-- Returns the number of entries removed; -1 when the job is not due (another replica took it, or later).
local due = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then
  return -1
end
redis.call('ZREM', KEYS[3], ARGV[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
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

local kept, removed = {}, 0
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  if delta(entry[2]) then
    removed = removed + 1
  else
    kept[#kept + 1] = entry
  end
end
if removed == 0 or #kept == 0 then
  return 0
end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local last
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then
    last = info[i + 1]
  end
end
redis.call('DEL', KEYS[1])
for _, entry in ipairs(kept) do
  redis.call('XADD', KEYS[1], entry[1], unpack(entry[2]))
end
redis.call('XSETID', KEYS[1], last)
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
redis.call('COPY', KEYS[1], KEYS[4], 'REPLACE')
redis.call('RENAME', KEYS[4], KEYS[1])
-- the view counted them (RUNS_EVENTS_MAXLEN); the rebuild adds them back to its fold (broker/rebuild.py)
redis.call('HINCRBY', KEYS[2], 'deltas_removed', removed)
return removed
