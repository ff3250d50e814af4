-- What a pass reads of one partition (SPEC S4.2 "What a turn costs"): the line's first jobs and the parked jobs'
-- first, with their scores, and the fronts entries of the line's jobs read (`advance|key|more|next ids…`; false for
-- a resubmit, or a job an older broker placed). Read-only; replaces the pass's ZRANGE of the line (one round trip).
-- KEYS[1] partition line zset   KEYS[2] partition parked zset   KEYS[3] partition fronts hash
-- KEYS[4] (optional) partition arrivals zset: the created ms of the jobs read (heads of one score go oldest first)
--   (one slot: the partition {pN})
-- ARGV[1] depth: how many of each
-- Returns {{job, score, ...} of the line, {job, score, ...} of the parked, {fronts entry or false, ...}} and, with
-- KEYS[4], {created ms or false, ...} of the line's jobs then the parked ones
local depth = tonumber(ARGV[1])
local line = redis.call('ZRANGE', KEYS[1], 0, depth - 1, 'WITHSCORES')
local parked = redis.call('ZRANGE', KEYS[2], 0, depth - 1, 'WITHSCORES')
local jobs = {}
for i = 1, #line, 2 do jobs[#jobs + 1] = line[i] end
local fronts = #jobs > 0 and redis.call('HMGET', KEYS[3], unpack(jobs)) or {}
if not KEYS[4] then
  return {line, parked, fronts}
end
for i = 1, #parked, 2 do jobs[#jobs + 1] = parked[i] end
local arrived = #jobs > 0 and redis.call('ZMSCORE', KEYS[4], unpack(jobs)) or {}
return {line, parked, fronts, arrived}
