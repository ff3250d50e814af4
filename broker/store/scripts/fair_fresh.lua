-- A newcomer's run settled (SPEC S4.2 "What a turn costs"; broker/admission/cost_line.py `fresh`): keys without a
-- turn are paced as one key, V moving past each by the newcomers' recent cost; this learns that cost (the average of
-- their latest runs, as a key's History: exact for the first 8, then each new run weighs 1/8). Once per attempt: the
-- caller runs it only for a settle fair_settle.lua applied.
-- KEYS[1] the first upstream's admission state (`{adm}`: one slot)
-- ARGV[1] mode   ARGV[2] measured cost (the mode's unit, not divided by the weight)
-- Returns {avg, n} of the newcomers' runs
local field = 'fresh:' .. ARGV[1]
local raw = redis.call('HGET', KEYS[1], field) or '0|0'
local avg, n = string.match(raw, '^([^|]*)|([^|]*)$')
avg, n = tonumber(avg) or 0, tonumber(n) or 0
avg = avg + (tonumber(ARGV[2]) - avg) / math.min(n + 1, 8)
n = n + 1
redis.call('HSET', KEYS[1], field, string.format('%.17g', avg) .. '|' .. n)
return {string.format('%.17g', avg), n}
