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
--       8 n, then n pairs (counter field, increment), then the stream entry's values in the
--       order of its fields below (usage.RECORD_FIELDS). Flat rather than JSON (decoding JSON
--       was a quarter of this script's cost), and values only: every argument costs.
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
local r = 8 + 2 * counters
redis.call('XADD', KEYS[10], 'MAXLEN', ARGV[7], '*', 'charged_tokens', charge,
           'ts', ARGV[r + 1], 'request_id', ARGV[r + 2], 'key_id', ARGV[r + 3],
           'model', ARGV[r + 4], 'provider', ARGV[r + 5], 'route_model', ARGV[r + 6],
           'thinking', ARGV[r + 7], 'route_reason', ARGV[r + 8], 'route', ARGV[r + 9],
           'prompt_tokens', ARGV[r + 10], 'completion_tokens', ARGV[r + 11],
           'reasoning_tokens', ARGV[r + 12], 'cached_tokens', ARGV[r + 13],
           'max_tokens', ARGV[r + 14], 'reserved_tokens', ARGV[r + 15],
           'latency_ms', ARGV[r + 16], 'ttft_ms', ARGV[r + 17], 'status', ARGV[r + 18],
           'error_code', ARGV[r + 19])
return charge
