-- Admit one request: check the key as it is now, reserve the worst case against budget, TPM
-- and concurrency, count it against RPM. Either everything is reserved or nothing changes.
-- KEYS: 1 key:{id} hash, 2 slots zset, 3 held hash, 4 rpm window, 5 tpm window,
--       6 spent (all), 7 spent (day), 8 spent (month), 9 gone hash
-- ARGV: 1 now (ms), 2 request token, 3 prompt tokens, 4 max_tokens, 5 slot lease (ms),
--       6 ms until the current minute window resets, 7 the presented secret's digest, 8 model,
--       9 how long the slots, held and gone hashes outlive their last write (ms)
-- Returns {0, max_tokens granted, reserved, rpm, rpm left, tpm, tpm left} (-1: no limit),
--   {1, why} key refused (revoked, rotated, disabled, expired), {2, budget left} over budget,
--   {3, retry ms, limit name, limit} rate limited, {4} model not allowed for this key,
--   {5} the gateway gave up on this admission and has already released it (see release.lua).
local now, token = tonumber(ARGV[1]), ARGV[2]
local prompt, grant = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, reset, keep = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[9])

if redis.call('HEXISTS', KEYS[9], token) == 1 then
  return {5}
end

local f = redis.call('HMGET', KEYS[1], 'rpm', 'tpm', 'conc', 'budget', 'period',
                     'digest', 'disabled', 'expires_ms', 'models')
if not f[6] or f[6] ~= ARGV[7] then
  return {1, 'revoked'}
end
if f[7] then
  return {1, 'disabled'}
end
if f[8] and tonumber(f[8]) <= now then
  return {1, 'expired'}
end
if f[9] and not string.find(f[9], '\n' .. ARGV[8] .. '\n', 1, true) then
  return {4}
end
local rpm, tpm, conc, budget = tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), tonumber(f[4])

-- Slots past their lease belong to requests whose replica died or lost Redis for longer than
-- a lease: their slots and reservations are dropped when they would make a difference (a
-- refusal or a clipped max_tokens) and on about one admission in 32 (so they cannot pile up),
-- not on every one: until then they only make admission stricter. A dropped slot is noted as
-- 'lapsed' in the gone hash, so that its settlement, if it still comes, is recorded once.
local function sweep()  -- returns the slots dropped and the tokens they held
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  local freed = 0
  for _, old in ipairs(expired) do
    redis.call('HSET', KEYS[9], old, 'lapsed')
    local amount = redis.call('HGET', KEYS[3], old)
    if amount then
      freed = freed + tonumber(amount)
      redis.call('HDEL', KEYS[3], old)
    end
  end
  if freed > 0 then
    redis.call('HINCRBY', KEYS[3], '_sum', -freed)
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    redis.call('PEXPIRE', KEYS[9], keep)
  end
  return #expired, freed
end
local swept = now % 32 == 0
if swept then
  sweep()
end

if budget then
  local spent_key = KEYS[6]
  if f[5] == 'day' then spent_key = KEYS[7] elseif f[5] == 'month' then spent_key = KEYS[8] end
  local spent = tonumber(redis.call('GET', spent_key)) or 0
  local held = tonumber(redis.call('HGET', KEYS[3], '_sum')) or 0
  local left = budget - spent - held
  if left < prompt + grant and not swept then
    swept = true
    local _, freed = sweep()
    left = left + freed
  end
  if left <= prompt then
    return {2, math.max(left, 0)}
  end
  if left < prompt + grant then
    grant = left - prompt
  end
end
if tpm and prompt + grant > tpm then
  if prompt >= tpm then
    return {3, reset, 'tpm_request', tpm}
  end
  grant = tpm - prompt
end
local need = prompt + grant

local requests = 0
if rpm then
  requests = tonumber(redis.call('GET', KEYS[4])) or 0
  if requests >= rpm then
    return {3, reset, 'rpm', rpm}
  end
end
local tokens = 0
if tpm then
  tokens = tonumber(redis.call('GET', KEYS[5])) or 0
  if tokens + need > tpm then
    return {3, reset, 'tpm', tpm}
  end
end
if conc then
  local busy = redis.call('ZCARD', KEYS[2])
  if busy >= conc and not swept then
    busy = busy - sweep()
  end
  if busy >= conc then
    return {3, 1000, 'concurrency', conc}
  end
end

redis.call('ZADD', KEYS[2], now + ttl, token)
redis.call('PEXPIRE', KEYS[2], keep)
if budget or tpm then  -- what the reservation is, for settlement and release
  redis.call('HSET', KEYS[3], token, need)
  redis.call('HINCRBY', KEYS[3], '_sum', need)
  redis.call('PEXPIRE', KEYS[3], keep)
end
local rpm_left, tpm_left = -1, -1
if rpm then
  if redis.call('INCR', KEYS[4]) == 1 then  -- a window's TTL is set once, when it opens
    redis.call('PEXPIRE', KEYS[4], reset + 1000)
  end
  rpm_left = rpm - requests - 1
end
if tpm then
  if redis.call('INCRBY', KEYS[5], need) == need then
    redis.call('PEXPIRE', KEYS[5], reset + 1000)
  end
  tpm_left = tpm - tokens - need
end
return {0, grant, need, rpm or -1, rpm_left, tpm or -1, tpm_left}
