-- Settle one request: release its slot and reservation, charge what it used (never more than
-- was reserved, never past the budget), give unused tokens back to its TPM window, and record
-- its usage (daily counters and the capped usage stream). Idempotent by request token: a
-- settlement applies only while its slot is held, or once after its lease lapsed and the slot
-- was swept (noted in the gone hash); a retry of one already applied changes nothing.
-- KEYS: 1 key:{id} hash, 2 slots zset, 3 held hash, 4 tpm window of admission,
--       5 spent (all), 6 spent (day), 7 spent (month), 8 usage day hash, 9 usage days set,
--       10 usage stream, 11 gone hash
-- ARGV: 1 request token, 2 reserved tokens, 3 used tokens (prompt + completion), 4 UTC day,
--       5 ttl of a day's spent counter (ms), 6 ttl of a month's (ms), 7 stream maxlen,
--       8 n, then n pairs (counter field, increment), then the stream entry's field/value pairs.
--       (Flat rather than JSON: decoding JSON was a quarter of this script's cost.)
-- Returns the tokens charged against the budget, or -1 when this settlement was applied before.
local token, reserved, used = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

if redis.call('ZREM', KEYS[2], token) == 1 then
  local amount = redis.call('HGET', KEYS[3], token)
  if amount then
    redis.call('HINCRBY', KEYS[3], '_sum', -tonumber(amount))
    redis.call('HDEL', KEYS[3], token)
  end
elseif redis.call('HGET', KEYS[11], token) == 'lapsed' then
  redis.call('HDEL', KEYS[11], token)
else
  return -1
end

local charge = math.min(used, reserved)
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('INCRBY', KEYS[4], charge - reserved)
end
local f = redis.call('HMGET', KEYS[1], 'budget', 'period')
local budget = tonumber(f[1])
if budget then
  local spent_key, ttl = KEYS[5], 0
  if f[2] == 'day' then
    spent_key, ttl = KEYS[6], tonumber(ARGV[5])
  elseif f[2] == 'month' then
    spent_key, ttl = KEYS[7], tonumber(ARGV[6])
  end
  local current = redis.call('GET', spent_key)
  local spent = tonumber(current) or 0
  charge = math.max(0, math.min(charge, budget - spent))
  redis.call('INCRBY', spent_key, charge)
  if ttl > 0 and not current then  -- a period's counter gets its TTL once, when it starts
    redis.call('PEXPIRE', spent_key, ttl)
  end
else
  charge = 0
end

local counters = tonumber(ARGV[8])
for i = 9, 8 + 2 * counters, 2 do
  redis.call('HINCRBY', KEYS[8], ARGV[i], ARGV[i + 1])
end
redis.call('SADD', KEYS[9], ARGV[4])
redis.call('XADD', KEYS[10], 'MAXLEN', ARGV[7], '*', 'charged_tokens', charge,
           unpack(ARGV, 9 + 2 * counters))
return charge
