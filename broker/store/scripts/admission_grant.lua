-- Settle one admission pass's reservations at once: give each claimed job its reserved slot (the jobs
-- the caller claimed off their partition lines with admission_claim.lua; a job's place is kept for a
-- later requeue), and give back the reservations no job was found for (the lines were shorter, or other
-- replicas claimed their heads first). A probe reserved for a granted reservation becomes that job's
-- (and is counted); a probe reserved for one given back is over. The virtual time of each priority (SPEC
-- S4.2) becomes at least one past the largest start tag granted in it and one past each place of the moves (a
-- first attempt's place, broker/admission/fair.py: a job that arrives after a grant sorts behind every job of its
-- tag that waited then; the caller's moves carry where its pass moved V to, `moved`); it never goes back. With
-- several upstreams (SPEC S10) every upstream settles its own reservations, and the first one's call (its state
-- holds V) also gets the places of the jobs granted on the others and the moves.
-- KEYS[1] admission state hash   KEYS[2] live zset   KEYS[3] slots hash   KEYS[4] reserved zset
--   (one slot: the upstream's, {adm} for the first of HERMES_URL, {adm:<name>} for the others, SPEC S10)
-- ARGV[1] now (epoch ms)   ARGV[2] slot ttl ms   ARGV[3] g, the number of grants   ARGV[4] u, of unused ones
-- ARGV[5] '1' when the pass's reservation may have taken the probe (admission_admit.lua saw a refusal; else no
-- reservation of the pass is the probe, and the state's probe is not read)
-- ARGV[6 .. 5+3g] g triples (reservation, job, its place in the line)   ARGV[6+3g .. 5+3g+u] unused reservations
-- ARGV[6+3g+u ..] places that move V only: of jobs granted on other upstreams, and the pass's moves (each one tag
-- before the V it moved to)
-- Returns the number of reservations given back
local expiry, g, u = tonumber(ARGV[1]) + tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local probe = ARGV[5] == '1' and redis.call('HGET', KEYS[1], 'probe')
local base, band, tags = 2 ^ 51, 2 ^ 50, {}
local function moves_v(value)
  local place = tonumber(value)
  if place and place >= base then
    local priority = math.min(math.floor((place - base) / band), 4) + 1
    local tag = place - base - (priority - 1) * band
    tags[priority] = math.max(tags[priority] or 0, tag + 1)
  end
end
for i = 6 + 3 * g + u, #ARGV do
  moves_v(ARGV[i])
end
for i = 6, 5 + 3 * g, 3 do
  local reservation, job = ARGV[i], ARGV[i + 1]
  moves_v(ARGV[i + 2])
  redis.call('ZREM', KEYS[4], reservation)
  redis.call('ZADD', KEYS[2], expiry, job)
  redis.call('HSET', KEYS[3], job, ARGV[i + 2])
  if probe == reservation then
    redis.call('HSET', KEYS[1], 'probe', job)
    redis.call('HINCRBY', KEYS[1], 'probes', 1)
  end
end
for priority, tag in pairs(tags) do
  local field = 'v' .. priority
  if tag > tonumber(redis.call('HGET', KEYS[1], field) or '0') then
    redis.call('HSET', KEYS[1], field, string.format('%.0f', tag))
  end
end
local n = 0
for i = 6 + 3 * g, 5 + 3 * g + u do
  n = n + redis.call('ZREM', KEYS[4], ARGV[i])
  if probe == ARGV[i] then
    redis.call('HSET', KEYS[1], 'probe', '')
  end
end
return n
