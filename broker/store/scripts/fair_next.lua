-- A pass's key step (SPEC S4.2 "What a turn costs"; broker/admission/cost.py `granted` and `left`): the jobs of one
-- fairness key a pass claimed, in order, leave the key's queue; each granted one charges the key its estimate once
-- (`c:<job>` written only when no charge of the job is in flight nor settled for that attempt: a second call, a
-- takeover or a settle, charges nothing); a job reported gone (`left`) charges nothing. The key's next job becomes
-- its front at the new F. Returns the front to place (fair_promote.lua, in its own partition): placing is idempotent.
-- On a single Redis the caller may name the front it expects (`expected`, its partition's keys in KEYS[6..9]): when
-- the step's front is that job, this script places it too (fair_promote.lua composed in as `fair_promote(KEYS,
-- ARGV)`: broker/store/scripts.py), as the pass's placing would (a front in the line stays where it is).
-- KEYS[1] the priority's turns zset   KEYS[2] the priority's keys hash   KEYS[3] the key's queue zset
-- KEYS[4] the key's cost hash   KEYS[5] the key's settled zset   (one slot: the key's partition {pK})
-- KEYS[6..9] with `expected`, on a single Redis: its partition's line, parked jobs and fronts, and its view
-- ARGV[1] fairness key   ARGV[2] priority   ARGV[3] weight   ARGV[4] V   ARGV[5] mode   ARGV[6] guess
-- ARGV[7] retention ms   ARGV[8] expected ('' none)   ARGV[9] the priority's band (a front's score: band + tag)
-- ARGV[10] the signals channel   ARGV[11] a newcomer's message prefix   ARGV[12] a joined job's message prefix
-- then per job: ARGV[i] job, ARGV[i+1] attempt, ARGV[i+2] `grant` or `left`
-- Returns {charged, begins, placed, front, tag, at_v, advance, paced, more, next ids...} (front '' when the key has
-- none; begins `job tag job tag…`: where each job charged started, what V moves past; placed fair_promote's answer
-- for the expected front, '' when it was not placed here)
local MAX_TAG, MAX_ADVANCE, UNIT, FLOOR = 2 ^ 50 - 1, 2 ^ 30, 10000, 1
local key, p, weight, v = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local function fmt(x) return string.format('%.0f', x) end
local function charge(c, w)
  if w <= 0 or c / w >= MAX_ADVANCE then return MAX_ADVANCE end
  return math.max(FLOOR, math.min(MAX_ADVANCE, math.floor(c / w + 0.5)))
end
-- The key's cost hash is read once (its History `avg`, `n` and its charges in flight `c:<job>`), and kept as this
-- script writes it: what the step charges, and where its runs in flight began (after()).
local cost = {}
do
  local fields = redis.call('HGETALL', KEYS[4])
  for i = 1, #fields, 2 do cost[fields[i]] = fields[i + 1] end
end
local function estimate()  -- the key's next charge, and '1' when it is the guess (no history)
  if ARGV[5] == 'runs' then return charge(UNIT, weight), '0' end
  if tonumber(cost.n or '0') > 0 then return charge(tonumber(cost.avg), weight), '0' end
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
-- The key's queue is read once: its length (`waiting`, less each job a ZREM takes out) and, after the last job
-- taken out, its first 17 jobs (`head`; the ZRANGE that finds the next front is the reply's too).
local waiting, head = redis.call('ZCARD', KEYS[3]), nil
local function taken(job)
  local n = redis.call('ZREM', KEYS[3], job)
  waiting, head = waiting - n, nil
  return n
end
local function first()
  if not head then head = redis.call('ZRANGE', KEYS[3], 0, 16) end
  return head[1]
end
local function save(line)
  if waiting > 0 then
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
  for field, value in pairs(cost) do
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
  local busy = waiting > 0
  local begin = (busy and line.f) or math.min(math.max(line.f or 0, v), MAX_TAG)
  -- charged once per attempt: a charge in flight, or one settled, is not charged again
  local charged = cost['c:' .. job] ~= nil or redis.call('ZSCORE', KEYS[5], job .. ':' .. attempt)
  if not charged then
    local at_v, paced = (not busy and begin == v) and '1' or '0', 0
    if line.front == job then at_v, paced = line.at_v, line.paced end
    local c = table.concat({p, fmt(advance), fmt(begin), at_v, fmt(paced), ARGV[3], attempt, guessed}, '|')
    redis.call('HSET', KEYS[4], 'c:' .. job, c)
    cost['c:' .. job] = c
    line.f = math.min(begin + advance, MAX_TAG)
  end
  taken(job)
  local upcoming = first()
  if line.front and line.front ~= job and upcoming == line.front then return not charged end
  if not upcoming then line.front = nil return not charged end
  promoted(line, upcoming, line.f or 0, advance)
  line.projected = math.max(line.projected, line.tag + advance)
  return not charged
end
local function left(line, job, advance)
  if taken(job) == 0 or line.front ~= job then return end
  local upcoming = first()
  if not upcoming then line.front = nil return end
  promoted(line, upcoming, line.f or 0, advance)
end
local line, charged, begins = load(), 0, {}
local advance, guessed = estimate()
local front = line.front
for i = 13, #ARGV, 3 do
  if ARGV[i + 2] == 'left' then
    left(line, ARGV[i], advance)
  elseif granted(line, ARGV[i], ARGV[i + 1], advance, guessed) then
    charged = charged + 1
    begins[#begins + 1] = ARGV[i] .. ' ' .. fmt(line.f - advance)
  end
end
if line.front and line.front ~= front then line.tag = math.min(math.max(line.tag, after()), MAX_TAG) end  -- behind its runs
save(line)
if charged > 0 then redis.call('PEXPIRE', KEYS[4], ARGV[7]) end
begins = table.concat(begins, ' ')
if not line.front then return {charged, begins, '', ''} end
first()
local queue = head
local more = queue[1] == line.front and waiting - 1 or 0
local following = {}
for i = 2, math.min(#queue, more + 1) do following[#following + 1] = queue[i] end
local placed = ''
if ARGV[8] ~= '' and ARGV[8] == line.front then
  local score = fmt(tonumber(ARGV[9]) + line.tag)
  local entry = table.concat({fmt(line.advance), more, table.concat(following, ' '), key}, '|')
  local message = ARGV[12] .. line.front
  if line.at_v == '1' then message = ARGV[11] .. score .. ' ' .. fmt(line.paced) .. ' ' .. line.front end
  placed = fair_promote({KEYS[6], KEYS[7], KEYS[8], KEYS[9]}, {line.front, score, entry, ARGV[10], message, ''})
end
local reply = {charged, begins, placed, line.front, fmt(line.tag), line.at_v, fmt(line.advance), fmt(line.paced),
  more}
for _, job in ipairs(following) do reply[#reply + 1] = job end
return reply
