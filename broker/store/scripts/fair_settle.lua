-- A run's settle (SPEC S4.2 "What a turn costs"; broker/admission/cost.py `settled`, `retagged` and
-- `History.settled`): the charge its grant wrote (`c:<job>`) is taken and F corrected by the measured cost minus it
-- (a key with waiting jobs keeps a credit, after a run charged the guess down to one turn behind V; an idle key's F
-- moves from max(F, V)), the key's History learns the measured cost, and its front moves to the corrected F with the
-- new estimate. Once per attempt: `<job>:<attempt>` goes into the settled zset, and a second settle (the driver's and
-- the usage sweep's) charges and learns nothing. No charge found and none settled: the grant's key step never ran (a
-- crash after the claim, or an older replica granted it): fair_next.lua's work is done first, charging the measured
-- cost.
-- KEYS[1] the priority's turns zset   KEYS[2] the priority's keys hash   KEYS[3] the key's queue zset
-- KEYS[4] the key's cost hash   KEYS[5] the key's settled zset   (one slot: the key's partition {pK})
-- ARGV[1] fairness key   ARGV[2] priority   ARGV[3] weight   ARGV[4] V   ARGV[5] mode   ARGV[6] guess
-- ARGV[7] retention ms   ARGV[8] job   ARGV[9] attempt   ARGV[10] measured cost ('': none, the estimate stands)
-- ARGV[11] now (epoch ms)
-- Returns {applied, delta, at_v, paced, units, seq, front, tag, at_v, advance, paced, more, next ids...}: applied 0
-- when settled before; units '' when nothing was measured; front '' when the key has none; seq the key's settle
-- count (its `seq` field, from now in ms when the field is new), so that the placings of two settles that land out
-- of order keep the later's turn (fair_promote.lua)
local MAX_TAG, MAX_ADVANCE, UNIT, FLOOR = 2 ^ 50 - 1, 2 ^ 30, 10000, 1
local key, p, weight, v = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local function fmt(x) return string.format('%.0f', x) end
local function charge(c, w)
  if w <= 0 or c / w >= MAX_ADVANCE then return MAX_ADVANCE end
  return math.max(FLOOR, math.min(MAX_ADVANCE, math.floor(c / w + 0.5)))
end
-- What the script reads more than once is read once: the key's queue length (`waiting`; granted() takes a job out
-- of the queue and forgets it) and its cost hash (`cost`: its History `avg`, `n` and its charges in flight
-- `c:<job>`, kept as the script writes them), each when first needed.
local waiting, cost
local function queued()
  if not waiting then waiting = redis.call('ZCARD', KEYS[3]) end
  return waiting
end
local function costs()
  if not cost then
    cost = {}
    local fields = redis.call('HGETALL', KEYS[4])
    for i = 1, #fields, 2 do cost[fields[i]] = fields[i + 1] end
  end
  return cost
end
local function learnt()  -- the key's History: {avg, n}
  local h = costs()
  return {tonumber(h.avg or '0'), tonumber(h.n or '0')}
end
local function estimate()  -- the key's next charge, and '1' when it is the guess (no history)
  if ARGV[5] == 'runs' then return charge(UNIT, weight), '0' end
  local h = learnt()
  if h[2] > 0 then return charge(h[1], weight), '0' end
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
local function save(line)
  if queued() > 0 then
    redis.call('HSET', KEYS[2], key, table.concat({fmt(line.f), fmt(line.projected), line.front or '',
      fmt(line.tag or 0), line.at_v or '0', fmt(line.advance or 0), fmt(line.paced or 0)}, '|'))
    redis.call('ZREM', KEYS[1], key)
    return
  end
  redis.call('HDEL', KEYS[2], key)
  if line.f and line.f > v then
    redis.call('ZADD', KEYS[1], fmt(line.f), key)
  else
    redis.call('ZREM', KEYS[1], key)
  end
end
local function after()  -- one past the starts of the key's charges in flight in this priority (cost.after)
  local floor = 0
  for field, value in pairs(costs()) do
    if string.sub(field, 1, 2) == 'c:' then
      local q, start = string.match(value, '^([^|]*)|[^|]*|([^|]*)')
      start = tonumber(start)
      if q == p and start and start + 1 > floor then floor = start + 1 end
    end
  end
  return floor
end
local function promoted(line, first, tag, advance)
  line.front, line.tag, line.at_v, line.advance, line.paced = first, tag, '0', advance, 0
end
local function granted(line, job, attempt, advance, guessed)
  local busy = queued() > 0
  local begin = (busy and line.f) or math.min(math.max(line.f or 0, v), MAX_TAG)
  -- charged once per attempt: a charge in flight, or one settled, is not charged again
  local charged = costs()['c:' .. job] ~= nil or redis.call('ZSCORE', KEYS[5], job .. ':' .. attempt)
  if not charged then
    local at_v, paced = (not busy and begin == v) and '1' or '0', 0
    if line.front == job then at_v, paced = line.at_v, line.paced end
    local c = table.concat({p, fmt(advance), fmt(begin), at_v, fmt(paced), ARGV[3], attempt, guessed}, '|')
    redis.call('HSET', KEYS[4], 'c:' .. job, c)
    cost['c:' .. job] = c
    line.f = math.min(begin + advance, MAX_TAG)
  end
  redis.call('ZREM', KEYS[3], job)
  waiting = nil
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if line.front and line.front ~= job and first == line.front then return not charged end
  if not first then line.front = nil return not charged end
  promoted(line, first, line.f or 0, advance)
  line.projected = math.max(line.projected, line.tag + advance)
  return not charged
end
local line, job, member = load(), ARGV[8], ARGV[8] .. ':' .. ARGV[9]
local measured = tonumber(ARGV[10])
local units = measured and charge(measured, weight)
local applied, delta, at_v, paced = 0, 0, '0', 0
if not redis.call('ZSCORE', KEYS[5], member) then
  if not costs()['c:' .. job] then granted(line, job, ARGV[9], units or estimate(), '0') end
  local c = {}
  for part in string.gmatch(cost['c:' .. job] .. '|', '([^|]*)|') do c[#c + 1] = part end
  redis.call('HDEL', KEYS[4], 'c:' .. job)
  cost['c:' .. job] = nil
  applied, at_v, paced = 1, c[4], tonumber(c[5])
  if units then
    local h = learnt()
    local avg, n = h[1], h[2]
    avg = avg + (measured - avg) / math.min(n + 1, 8)
    local stored = string.format('%.17g', avg)
    redis.call('HSET', KEYS[4], 'avg', stored, 'n', n + 1)
    cost.avg, cost.n = stored, n + 1
    local advance = estimate()
    delta = math.max(units, FLOOR) - tonumber(c[2])
    if delta ~= 0 and queued() > 0 and line.f then
      -- a run charged the guess: a credit down to one turn behind V (V moved by the guess too; cost.behind)
      local f = line.f + delta
      if delta < 0 and c[8] == '1' then f = math.max(f, v - advance, 0) end
      f = math.min(f, MAX_TAG)
      delta, line.f = f - line.f, f
    elseif delta ~= 0 then
      local f = math.min(math.min(math.max(line.f or 0, v), MAX_TAG) + delta, MAX_TAG)
      line.f = f > v and f or nil
    end
  end
  if line.front and line.f and queued() > 0 then
    -- the front moves to the corrected F (behind its key's jobs in flight), with the key's estimate (what a pass
    -- plans its next jobs by)
    line.tag, line.advance = math.min(math.max(line.f, after()), MAX_TAG), estimate()
  end
  local now = tonumber(ARGV[11])
  redis.call('ZADD', KEYS[5], ARGV[11], member)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. fmt(now - tonumber(ARGV[7])))
  redis.call('PEXPIRE', KEYS[5], ARGV[7])
  if not line.front then redis.call('PEXPIRE', KEYS[4], ARGV[7]) end  -- with a front: below, after its seq
  save(line)
end
local reply = {applied, fmt(delta), at_v, fmt(paced), units and fmt(units) or '', 0}
if not line.front then reply[#reply + 1] = '' return reply end
if costs().seq == nil then
  -- a new count (the key's first settle, or its cost hash expired: a run or a hold longer than the retention) starts
  -- at now (ms): above the count any of its fronts was placed with, unless the key settled more than once per ms
  redis.call('HSET', KEYS[4], 'seq', ARGV[11])
end
reply[6] = redis.call('HINCRBY', KEYS[4], 'seq', 1)
redis.call('PEXPIRE', KEYS[4], ARGV[7])
local queue = redis.call('ZRANGE', KEYS[3], 0, 16)
local more = queue[1] == line.front and queued() - 1 or 0
for _, x in ipairs({line.front, fmt(line.tag), line.at_v, fmt(line.advance), fmt(line.paced), more}) do
  reply[#reply + 1] = x
end
for i = 2, math.min(#queue, more + 1) do reply[#reply + 1] = queue[i] end
return reply
