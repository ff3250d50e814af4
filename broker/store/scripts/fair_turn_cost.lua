-- A new first attempt joins its fairness key's queue (SPEC S4.2 "What a turn costs", ADMISSION_FAIRNESS_COST
-- `time` or `tokens`; broker/admission/cost.py `enter`; today's `runs` arithmetic stays fair_turn.lua): a key with no
-- waiting job makes it its front at max(F, V) (F read from `turns`, where idle keys' debts wait; those at or below V
-- dropped as fair_turn.lua does), charged nothing yet; a key with waiting jobs parks it behind them, at its projection
-- (F plus the estimates of the jobs ahead: a fallback order only). The estimate is the key's History's (or the
-- guess), read here: a create reads nothing first. Run before the job write (the key's partition), as fair_turn.lua.
-- A retried create (the job already queued) places it as before: the front again, or parked. Its first write is a
-- ZADD (a command Redis refuses past maxmemory): Redis refuses a script's writes only up to its first one, and in a
-- job write (append_events.lua, where this runs first on a single Redis) a full Redis must refuse the create whole.
-- KEYS[1] the priority's turns zset   KEYS[2] the priority's keys hash   KEYS[3] the key's queue zset
-- KEYS[4] the key's cost hash   KEYS[5] the key's settled zset   (one slot: the key's partition {pK})
-- ARGV[1] fairness key   ARGV[2] priority   ARGV[3] weight   ARGV[4] V (cost.entering)   ARGV[5] mode
-- ARGV[6] guess   ARGV[7] retention ms   ARGV[8] job   ARGV[9] created ms   ARGV[10] paced (a newcomer's advance; '': its
-- key's estimate)
-- Returns {tag, parked, at_v, advance, paced}
local MAX_TAG, MAX_ADVANCE, UNIT, FLOOR = 2 ^ 50 - 1, 2 ^ 30, 10000, 1
local key, p, weight, v = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local function fmt(x) return string.format('%.0f', x) end
local function charge(c, w)
  if w <= 0 or c / w >= MAX_ADVANCE then return MAX_ADVANCE end
  return math.max(FLOOR, math.min(MAX_ADVANCE, math.floor(c / w + 0.5)))
end
local function estimate()  -- the key's next charge, and '1' when it is the guess (no history)
  if ARGV[5] == 'runs' then return charge(UNIT, weight), '0' end
  local h = redis.call('HMGET', KEYS[4], 'avg', 'n')
  if tonumber(h[2] or '0') > 0 then return charge(tonumber(h[1]), weight), '0' end
  return charge(tonumber(ARGV[6]), weight), '1'
end
local function load()
  local raw = redis.call('HGET', KEYS[2], key)
  if not raw then return {f = tonumber(redis.call('ZSCORE', KEYS[1], key) or ''), projected = 0} end
  local x = {}
  for part in string.gmatch(raw .. '|', '([^|]*)|') do x[#x + 1] = part end
  local front = x[3] ~= '' and x[3] or nil
  return {f = tonumber(x[1]), projected = tonumber(x[2]), front = front, tag = tonumber(x[4]), at_v = x[5],
    advance = tonumber(x[6]), paced = tonumber(x[7])}
end
local function save(line)  -- after the job joined the key's queue: the key has a waiting job (its line is kept in KEYS[2])
  redis.call('HSET', KEYS[2], key, table.concat({fmt(line.f), fmt(line.projected), line.front or '',
    fmt(line.tag or 0), line.at_v or '0', fmt(line.advance or 0), fmt(line.paced or 0)}, '|'))
  redis.call('ZREM', KEYS[1], key)
end
local line, job = load(), ARGV[8]
if redis.call('ZSCORE', KEYS[3], job) then
  if line.front == job then return {fmt(line.tag), 0, line.at_v, fmt(line.advance), fmt(line.paced)} end
  return {fmt(math.min(math.max(line.projected, line.f or 0), MAX_TAG)), 1, '0', '0', '0'}
end
local advance = estimate()
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
local arrived = math.max(tonumber(ARGV[9]), last and tonumber(last) + 1 or 0)
if not last then
  local tag = math.min(math.max(line.f or 0, v), MAX_TAG)
  local at_v = tag == v and '1' or '0'
  local paced = tag == v and (tonumber(ARGV[10]) or advance) or 0
  redis.call('ZADD', KEYS[3], fmt(arrived), job)  -- a ZADD first: a Redis past maxmemory refuses the script here
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(v))
  save({f = tag, projected = math.min(tag + advance, MAX_TAG), front = job, tag = tag, at_v = at_v, advance = advance,
    paced = paced})
  return {fmt(tag), 0, at_v, fmt(advance), fmt(paced)}
end
local projected = math.min(math.max(line.projected, line.f or 0), MAX_TAG)
line.projected = math.min(projected + advance, MAX_TAG)
redis.call('ZADD', KEYS[3], fmt(arrived), job)
save(line)
return {fmt(projected), 1, '0', '0', '0'}
