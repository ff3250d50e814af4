-- Append events to a job's stream and store the view folded up to the last of them.
-- Optimistic concurrency by expected last id; optional fencing by lease token.
-- KEYS[1] job events stream   KEYS[2] job view hash   KEYS[3] job lease   KEYS[4] work stream
-- ARGV[1] expected last id ('' = do not check)   ARGV[2] lease token ('' = not fenced)
-- ARGV[3] retention ms   ARGV[4] job view JSON   ARGV[5] job id to enqueue ('' = none)
-- ARGV[6..] event JSONs
-- Returns {'OK', id1, id2, ...} | {'MISSING'} | {'FENCED'} | {'CONFLICT', actual last id}
if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return {'FENCED'}
end
local last = redis.call('HGET', KEYS[2], 'last_id')
if not last then
  return {'MISSING'}
end
if ARGV[1] ~= '' and last ~= ARGV[1] then
  return {'CONFLICT', last}
end
local reply = {'OK'}
for i = 6, #ARGV do
  last = redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
  reply[#reply + 1] = last
end
redis.call('HSET', KEYS[2], 'state', ARGV[4], 'last_id', last)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if ARGV[5] ~= '' then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', 100000, '*', 'job', ARGV[5])
end
return reply
