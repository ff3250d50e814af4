-- Remove a finished job's message.delta entries once RUNS_DELTA_RETENTION has passed since it ended
-- (SPEC S3.6): every other entry keeps its id and the stream its last id, and the room is given back.
-- XDEL alone leaves deleted entries inside nodes that still hold others (and COPY copies them), so the
-- stream is rewritten: its remaining entries re-added under their own ids, its last id and TTL restored,
-- then copied and renamed over itself as the terminal write does (no reserve at its end). Atomic, so a
-- reader sees the stream before or after, never between.
-- KEYS[1] job events   KEYS[2] job view hash   KEYS[3] partition delta schedule zset
-- KEYS[4] partition scratch key   (one slot: {pN})
-- ARGV[1] job id   ARGV[2] now (epoch ms)   ARGV[3] the view JSON without its output ('' = keep the view)
-- ARGV[4] SHA-1 of the view JSON ARGV[3] was made from: with it still in `state` and the output of the kept
--   JobFinished entry equal to the view's, the view hash keeps `lean` = ARGV[3] and `output_at` = that entry's id
--   instead of `state` (broker/store/lean.py)
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
-- The entry that holds the output the view holds too: then the view need not keep a copy of it
local function holding(output)
  for i = #kept, 1, -1 do
    local value = kept[i][2][2]
    if kept[i][2][1] == 'e' and string.find(value, '"type":"JobFinished"', 1, true) then
      local ok, event = pcall(cjson.decode, value)
      return ok and type(event) == 'table' and event.output == output and kept[i][1] or nil
    end
  end
  return nil
end
local state = ARGV[3] ~= '' and redis.call('HGET', KEYS[2], 'state')
if state and redis.sha1hex(state) == ARGV[4] then
  local ok, view = pcall(cjson.decode, state)
  local at = ok and type(view) == 'table' and type(view.output) == 'string' and holding(view.output)
  if at then
    redis.call('HSET', KEYS[2], 'lean', ARGV[3], 'output_at', at)
    redis.call('HDEL', KEYS[2], 'state')
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
