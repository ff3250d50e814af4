-- A newcomer's run settled (SPEC S4.2 "What a turn costs"; broker/admission/cost.py `pushed`, `Newcomers`): keys
-- without a turn are paced as one key, V moving past each by `paced`, the newcomers' recent cost; this learns that
-- cost (the average of their latest runs, as a key's History: exact for the first 8, then each new run weighs 1/8)
-- and moves V on by what the run cost beyond `paced` (never back). Once per attempt: the caller runs it only for a
-- settle fair_settle.lua applied.
-- KEYS[1] the first upstream's admission state (`{adm}`: one slot)
-- ARGV[1] mode   ARGV[2] measured cost (the mode's unit, not divided by the weight)   ARGV[3] priority
-- ARGV[4] units (the measured cost in tag units)   ARGV[5] paced
-- Returns {avg, n} of the newcomers' runs
local field = 'fresh:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field) or '0|0'
local avg, n = string.match(raw, '^([^|]*)|([^|]*)$')
avg, n = tonumber(avg) or 0, tonumber(n) or 0
avg = avg + (tonumber(ARGV[2]) - avg) / math.min(n + 1, 8)
n = n + 1
local fresh = string.format('%.17g', avg) .. '|' .. n
redis.call('HSET', KEYS[1], field, fresh)
local over = tonumber(ARGV[4]) - tonumber(ARGV[5])
if over > 0 then
  local v = 'v' .. ARGV[3]
  local tag = math.min((tonumber(redis.call('HGET', KEYS[1], v) or '0') or 0) + over, 2 ^ 50 - 1)
  redis.call('HSET', KEYS[1], v, string.format('%.0f', tag))
end
return {string.format('%.17g', avg), n}
