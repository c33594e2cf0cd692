-- Release an admission the gateway gave up on (Redis did not answer in time, or the connection
-- was lost): whether it ran, will run later (a stalled Redis runs what it had queued), or never
-- arrives, afterwards it holds nothing. Idempotent by request token.
-- KEYS: 1 slots zset, 2 held hash, 3 rpm window of admission, 4 tpm window of admission,
--       5 gone hash
-- ARGV: 1 request token, 2 how long the gone hash outlives its last write (ms)
-- Returns 1 when an admission was undone, 0 when it is barred from landing later.
local token = ARGV[1]
if redis.call('ZREM', KEYS[1], token) == 1 then
  local amount = redis.call('HGET', KEYS[2], token)
  if amount then
    redis.call('HINCRBY', KEYS[2], '_sum', -tonumber(amount))
    redis.call('HDEL', KEYS[2], token)
    if redis.call('EXISTS', KEYS[4]) == 1 then
      redis.call('DECRBY', KEYS[4], amount)
    end
  end
  local cost = redis.call('HGET', KEYS[2], '$' .. token)
  if cost then
    redis.call('HINCRBY', KEYS[2], '_csum', -tonumber(cost))
    redis.call('HDEL', KEYS[2], '$' .. token)
  end
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('DECR', KEYS[3])
  end
  return 1
end
if redis.call('HGET', KEYS[5], token) == 'lapsed' then  -- it ran, and its lease was swept
  redis.call('HDEL', KEYS[5], token)
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('DECR', KEYS[3])
  end
  return 1
end
redis.call('HSET', KEYS[5], token, 'void')  -- admission refuses a token marked void
redis.call('PEXPIRE', KEYS[5], ARGV[2])
return 0
