-- The one write of a job: append events, store the views folded up to the last of them, start the
-- retention of a job that ends, keep the admission line, the due schedule and the listing, and persist
-- the board projection with its pending delivery (SPEC S3.6, S3.9, S5.3), atomically.
-- KEYS[1] job events   KEYS[2] job view hash   KEYS[3] job lease   KEYS[4] partition due zset
-- KEYS[5] job board hash   KEYS[6] partition board outbox   KEYS[7] partition board due zset
-- KEYS[8] partition board index zset   KEYS[9] partition admission line zset
-- KEYS[10] partition listing index of every job   KEYS[11] partition scratch key (compaction)
-- KEYS[12] partition fair hash (waiting jobs per fairness key)   KEYS[13] partition arrivals zset
-- KEYS[14..13+w.statuses] partition listing index of each job status
--   (one slot: every key above carries the job's partition tag {pN})
-- KEYS[14+w.statuses] partition delta schedule zset (finished job -> when its deltas are removed)
-- KEYS[15+w.statuses] the turns zset of the job's fairness key and priority: only on a single Redis, with `turn`
-- KEYS[w.top] partition fair top zset (fairness key -> its count in KEYS[12]): with `top`, in a write that enters
--   or leaves the line
-- KEYS[bound.key.first..last] partition fair hashes, KEYS[bound.all.first..last] partition lines: with `bound`
--   (on a single Redis every partition's; on a cluster the job's own: one slot)
-- KEYS[w.cost.parked] partition parked zset, KEYS[w.cost.fronts] partition fronts hash: with `cost`
-- KEYS[w.cost.turn.first..+4] the fairness key's cost-aware keys (keys.cost_keys): with `cost.turn`, on a single Redis
-- KEYS[w.usage.key] partition usage zset (facts not yet counted in their hour, SPEC S4.5): with `usage`
-- ARGV[1] the write, a JSON object of strings:
--   job        the job id
--   expect     '' = do not check, '$new' = create only if the job does not exist, else the expected last id
--   token      the lease token that fences the write ('' = not fenced)
--   retention  ms a finished job's keys live after its terminal write (and its listing entries)
--   expire     present: the job ends in this write: its stream and view expire `retention` from now.
--              A job that has not ended has no TTL (SPEC S3.6); a write that moves it in the listing
--              removes a TTL that a broker before this version gave it (renewed on every append), so
--              a long job of an older store cannot expire while it runs
--   statuses   how many status indexes follow KEYS[13]
--   compact    present: the stream gets no more appends for a while (a create, a terminal write): copy it
--              and rename the copy over it, which frees the room Redis reserves at the end of a stream's
--              last node (about 4 KB) and keeps the ids, the last id and the TTL
--   due        present: the job's next wake-up in the due schedule (epoch ms)
--   line       'enter': the job joins the admission line at `place` (arrival order);
--              'leave': it leaves the line (it is terminal)
--   place      with 'enter': its score in the line (SPEC S4.2: broker/admission/fair.py)
--   turn       with 'enter', on a single Redis: {key, v, advance, most, band}: the job takes its fairness key's
--              turn here, with fair_turn.lua's numbers (on a cluster that script runs before, in the key's
--              partition, and gives `place`); its place is `band` + its start tag. A replay takes none
--   arrived    with 'enter': the job's created ms, kept in KEYS[13] until it ends (a pass orders jobs of one
--              score by it, admission_ties.lua); entries older than the retention are trimmed by the creates of
--              ids ending in 0 (one in 16: a job's end takes its entry out; only strays are ever that old)
--   fair       with 'enter', present: {key, weight}, the job's fairness key and weight: the job is counted among
--              the key's waiting jobs in KEYS[12] while it waits in a priority band (a score >= 2^51, SPEC S4.2);
--              a terminal write that takes it off the line uncounts it (the key is in the view JSON, ARGV[2])
--   top        present: the index in KEYS of the partition's fair top zset, where each count of KEYS[12] is
--              mirrored (the keys with most waiting jobs, SPEC S4.2)
--   joined     with 'enter': {channel, message, newcomer}: `message` is published so every replica's admission
--              pass reads the job's partition, at once (broker/store/signals.py; PUBLISH names no key; the
--              create's only wake-up: no doorbell in the work stream);
--              `newcomer` (with `turn`) instead when the job starts at V, its key having no turn ahead of it
--   cost       present (ADMISSION_FAIRNESS_COST time or tokens, SPEC S4.2 "What a turn costs"): {parked, fronts}, the
--              indexes in KEYS of the partition's parked zset and fronts hash, and with 'enter' (fair_turn_cost.lua
--              placed the job, `place` its score) `park` ('1': the job waits parked behind its key's front, not in
--              the line) or `entry` (its key's front: its fronts entry `advance|more|next ids|key`), or instead of
--              both, on a single Redis, `turn` {first, args, band, tail, prefix}: the job takes its key's turn here,
--              fair_turn_cost(KEYS[first..first+4], args) (the composed function): its place is `band` + the tag,
--              a front's entry its advance .. `tail`, and `joined`'s newcomer message `prefix` .. place, paced, job
--              when it starts at V. A replay (EXISTS) or a refused create (FULL) takes none; with 'leave'
--              the job leaves the parked jobs (uncounted as from the line) and the fronts too
--   deltas     present (with `expire`): when the job's message deltas are removed (epoch ms, S3.6)
--   release    present (with `expire` and a `token`): the job ends in its driver's write: its run lease
--              (KEYS[3]) is released and the job leaves the due schedule (KEYS[4]) here, as release_lease.lua
--              would right after (one round trip less)
--   runs       present: [field, run id, ...] of the view hash: the Hermes run id of each attempt accepted
--              in this write or whose events it stores packed (broker/codec.py: they leave it out)
--   callback   present (a job with a callback whose events owe deliveries, SPEC S5.8): {hash, due (indexes in
--              KEYS of the job's callback hash and the partition's callbacks due zset), url, now (epoch ms),
--              ttl (ms the hash lives from the job's terminal write), add: [{id, body}]}: each owed delivery
--              joins the hash's queue (an id owed already is not owed twice) and the job is due at once,
--              unless a delivery of it is due or claimed already; nothing after a 410 (`status` gone)
--   usage      present: {key (the index in KEYS of the partition's usage zset), items: [score, fact, ...]}: what
--              the events add to their fairness key's usage, counted in its hour by the usage sweep
--   board      present: a new board version {at, change ('1' = state change), expire (epoch ms),
--              refresh (ms), now (epoch ms)}
--   bound      with '$new', present: the waiting bounds the job must be under to join (SPEC S4.4), checked before
--              anything is written: {name = its fairness key, key = {most, base, first, last}, all = {most, base,
--              first, last}} (each optional): `key` counts `base` plus the key's `n:` in the fair hashes
--              KEYS[first..last], `all` counts `base` plus the jobs of the lines KEYS[first..last]; `base` is what
--              the caller counted where the script cannot see (a cluster's other partitions). At `most`: FULL
--   index      present (the job's status or updated_at changed): the listing entry {score (the view's
--              updated_at ms), key (the index of its status, one of KEYS[14..]), from (present: the index of
--              its previous status), sweep (present: previous status unknown, leave every other index)}
-- ARGV[2] job view JSON   ARGV[3] board fold state JSON ('' = no board)   ARGV[4] board report ('' = none)
-- ARGV[5..] event JSONs, oldest first
-- Returns {'OK', id1, ...} | {'EXISTS', view JSON} | {'FULL', 'key' | 'all'} (nothing written) | {'MISSING'} | {'FENCED'} | {'CONFLICT', actual last id}
local w = cjson.decode(ARGV[1])
if w.token ~= '' and redis.call('GET', KEYS[3]) ~= w.token then
  return {'FENCED'}
end
local last = redis.call('HGET', KEYS[2], 'last_id')
if w.expect == '$new' then
  if last then
    return {'EXISTS', redis.call('HGET', KEYS[2], 'state') or ''}  -- '' (a lean view): the caller reads it
  end
  local b = w.bound
  if b and b.key then
    local n, field = tonumber(b.key.base), 'n:' .. b.name
    for i = b.key.first, b.key.last do
      n = n + tonumber(redis.call('HGET', KEYS[i], field) or '0')
    end
    if n >= tonumber(b.key.most) then
      return {'FULL', 'key'}
    end
  end
  if b and b.all then
    local n = tonumber(b.all.base)
    for i = b.all.first, b.all.last do
      n = n + redis.call('ZCARD', KEYS[i])
    end
    if n >= tonumber(b.all.most) then
      return {'FULL', 'all'}
    end
  end
elseif not last then
  return {'MISSING'}
elseif w.expect ~= '' and last ~= w.expect then
  return {'CONFLICT', last}
end

local turned_at_v = false
if w.line == 'enter' and w.cost and w.cost.turn then
  -- a single Redis: the key's cost-aware turn (fair_turn_cost.lua, composed in), before anything is written (its
  -- first write a ZADD, which a Redis past maxmemory refuses: then nothing is)
  local c, k, first = w.cost, w.cost.turn, tonumber(w.cost.turn.first)
  local r = fair_turn_cost({unpack(KEYS, first, first + 4)}, k.args)
  w.place = string.format('%.0f', tonumber(k.band) + tonumber(r[1]))
  if r[2] == 1 then
    c.park = '1'
  else
    c.entry = r[4] .. k.tail
  end
  turned_at_v = r[3] == '1'
  if turned_at_v then
    w.joined.newcomer = k.prefix .. w.place .. ' ' .. r[5] .. ' ' .. w.job
  end
end

local reply = {'OK'}
for i = 5, #ARGV do
  last = redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
  reply[#reply + 1] = last
end
if w.compact then
  redis.call('COPY', KEYS[1], KEYS[11], 'REPLACE')
  redis.call('RENAME', KEYS[11], KEYS[1])
end
local top = w.top and KEYS[tonumber(w.top)]
local function counted(key, by, weight)
  -- the partition's count of the key's waiting jobs, mirrored in the top zset (the count itself, not a delta,
  -- so a key an older broker counted alone is mended here); a key without any is forgotten (bounded state)
  local n = redis.call('HINCRBY', KEYS[12], 'n:' .. key, by)
  if n <= 0 then
    redis.call('HDEL', KEYS[12], 'n:' .. key, 'w:' .. key)
    if top then
      redis.call('ZREM', top, key)
    end
  else
    if weight then
      redis.call('HSET', KEYS[12], 'w:' .. key, weight)
    end
    if top then
      redis.call('ZADD', top, n, key)
    end
  end
end
local last_status = 13 + tonumber(w.statuses)
if w.line == 'enter' then
  local place = w.place
  local t = w.turn
  local at_v = turned_at_v
  if t then
    local turns, v, most = KEYS[last_status + 2], tonumber(t.v), tonumber(t.most)
    local s = math.min(math.max(tonumber(redis.call('ZSCORE', turns, t.key) or '0'), v), most)
    at_v = s == v
    redis.call('ZREMRANGEBYSCORE', turns, '-inf', string.format('%.0f', v))
    redis.call('ZADD', turns, string.format('%.0f', math.min(s + tonumber(t.advance), most)), t.key)
    place = string.format('%.0f', tonumber(t.band) + s)
  end
  local c = w.cost
  if c and c.park then
    redis.call('ZADD', KEYS[tonumber(c.parked)], place, w.job)
  else
    redis.call('ZADD', KEYS[9], place, w.job)
    if c and c.entry then
      redis.call('HSET', KEYS[tonumber(c.fronts)], w.job, c.entry)
    end
  end
  if w.arrived then
    redis.call('ZADD', KEYS[13], w.arrived, w.job)
    if string.sub(w.job, -1) == '0' then  -- one create in 16 trims (a job's end takes its own entry out)
      redis.call('ZREMRANGEBYSCORE', KEYS[13], '-inf', '(' .. (tonumber(w.arrived) - tonumber(w.retention)))
    end
  end
  if w.fair and tonumber(place) >= 2 ^ 51 then
    counted(w.fair.key, 1, w.fair.weight)
  end
  if w.joined then
    redis.call('PUBLISH', w.joined.channel, at_v and w.joined.newcomer or w.joined.message)
  end
elseif w.line == 'leave' then
  redis.call('ZREM', KEYS[13], w.job)
  local from = KEYS[9]
  local place = redis.call('ZSCORE', from, w.job)
  local c = w.cost
  if c then
    redis.call('HDEL', KEYS[tonumber(c.fronts)], w.job, 'q:' .. w.job)
    if not place then
      from = KEYS[tonumber(c.parked)]
      place = redis.call('ZSCORE', from, w.job)
    end
  end
  if place then
    redis.call('ZREM', from, w.job)
    if tonumber(place) >= 2 ^ 51 then
      local ok, view = pcall(cjson.decode, ARGV[2])
      local s = ok and type(view) == 'table' and view.scheduling
      counted(type(s) == 'table' and type(s.fairness_key) == 'string' and s.fairness_key or '', -1, nil)
    end
  end
end
local view = {'state', ARGV[2], 'last_id', last}
for _, item in ipairs(w.runs or {}) do
  view[#view + 1] = item
end
redis.call('HSET', KEYS[2], unpack(view))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], 'board', ARGV[3])
end
if w.expire then
  redis.call('PEXPIRE', KEYS[1], w.retention)
  redis.call('PEXPIRE', KEYS[2], w.retention)
  if w.release and w.token ~= '' then  -- the fence above read KEYS[3]: it is this token's
    redis.call('DEL', KEYS[3])
    redis.call('ZREM', KEYS[4], w.job)
  end
elseif w.index and w.expect ~= '$new' and redis.call('PERSIST', KEYS[2]) == 1 then
  redis.call('PERSIST', KEYS[1])
end
if w.due then
  redis.call('ZADD', KEYS[4], w.due, w.job)
end
if w.deltas then
  redis.call('ZADD', KEYS[last_status + 1], w.deltas, w.job)
end
if w.usage then
  redis.call('ZADD', KEYS[tonumber(w.usage.key)], unpack(w.usage.items))
end

local x = w.index
if x then
  -- The listing (SPEC S3.9): the job under its latest change in the all-jobs index and in the index of
  -- its status, out of its previous status's index. When a job ends, finished jobs of its status whose
  -- retention has passed (they have expired; the reader skips them too) leave that index and the all-jobs
  -- index; nothing else is trimmed by age: a job that waits or runs never expires (SPEC S3.6).
  local target, from = nil, nil
  for i = 14, last_status do
    if KEYS[i] == x.key then
      target = KEYS[i]
    elseif KEYS[i] == x.from or x.sweep then
      from = KEYS[i]
      redis.call('ZREM', KEYS[i], w.job)
    end
  end
  if not target or (x.from and not from) then
    return redis.error_reply('index key not among KEYS')
  end
  redis.call('ZADD', KEYS[10], x.score, w.job)
  redis.call('ZADD', target, x.score, w.job)
  if w.expire then
    local floor = '(' .. (tonumber(x.score) - tonumber(w.retention))
    local expired = redis.call('ZRANGEBYSCORE', target, '-inf', floor, 'LIMIT', 0, 100)
    if #expired > 0 then
      redis.call('ZREM', target, unpack(expired))
      redis.call('ZREM', KEYS[10], unpack(expired))
    end
  end
end

local c = w.callback
if c then
  local hash, due = KEYS[tonumber(c.hash)], KEYS[tonumber(c.due)]
  if redis.call('HGET', hash, 'status') ~= 'gone' then
    local queue = redis.call('HGET', hash, 'queue') or ''
    for _, d in ipairs(c.add) do
      if redis.call('HSETNX', hash, 'b:' .. d.id, d.body) == 1 then
        redis.call('HSET', hash, 's:' .. d.id, c.now)
        queue = queue == '' and d.id or (queue .. ' ' .. d.id)
      end
    end
    redis.call('HSET', hash, 'url', c.url, 'status', 'pending', 'queue', queue)
    redis.call('ZADD', due, 'NX', c.now, w.job)
  end
  if w.expire then
    redis.call('PEXPIRE', hash, c.ttl)
  end
end

local b = w.board
if b then
  -- A new immutable board version: it is the latest and pending; state changes go out at once,
  -- activity-only versions at most once per refresh interval after the key's previous delivery.
  redis.call('HSET', KEYS[5], 'latest', ARGV[4], 'latest_at', b.at, 'pending_at', b.at, 'expire_at', b.expire)
  if b.change == '1' then
    redis.call('HSET', KEYS[5], 'pending_change', '1')
  end
  redis.call('PEXPIREAT', KEYS[5], b.expire)
  redis.call('ZADD', KEYS[8], b.expire, w.job)
  local delivered = tonumber(redis.call('HGET', KEYS[5], 'delivered_ms') or '0')
  local due = delivered + tonumber(b.refresh)
  if b.change == '1' or tonumber(b.now) >= due then
    redis.call('XADD', KEYS[6], 'MAXLEN', '~', 100000, '*', 'job', w.job, 'at', b.at)
  else
    redis.call('ZADD', KEYS[7], 'NX', due, w.job)
  end
end
return reply
