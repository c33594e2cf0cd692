-- Settle a batch of requests, one after the other: for each, release its slot and reservation,
-- charge what it used (never more than was reserved, never past the budget), give unused
-- tokens back to its TPM window, and record its usage (daily counters and the capped usage
-- stream). Idempotent by request token: a settlement applies only while its slot is held, or
-- once after its lease lapsed and the slot was swept (noted in the gone hash); a retry of one
-- already applied, in this batch or before, changes nothing. What several settlements of a
-- batch read (a key's budget, its spent counter) is read once, and the counters they add to
-- are written once at the end.
-- KEYS: the keys of each settlement, once for the settlements that name the same ones: 1
--   key:{id} hash, 2 slots zset, 3 held hash, 4 tpm window of admission, 5 spent (all), 6 spent
--   (day), 7 spent (month), 8 usage day hash, 9 usage days set, 10 usage stream, 11 gone hash,
--   12 spent cost (all), 13 spent cost (day), 14 spent cost (month).
-- A refusal (reserved tokens -1: a request admission refused for its budget or a rate limit)
-- is recorded the same way with nothing charged or released, once: its key 4 is then its own
-- once-marker, set for ARGV 4 ms (a retry of a refusal recorded before changes nothing).
-- ARGV: 1 ttl of a day's spent counter (ms), 2 ttl of a month's (ms), 3 stream maxlen (0: not
--   trimmed here, the usage store's consumer trims what it has stored), 4 how long a refusal's
--   once-marker is kept (ms), 5 the settlements, packed with MessagePack (values arrive typed, with none of the cost of an
--   argument each): per settlement {where its keys start in KEYS (0-based), request token,
--   reserved tokens, used tokens (prompt + completion), UTC day, {counter field = increment},
--   then the stream entry's values in the order of its fields below (usage.RECORD_FIELDS),
--   cost reserved, cost used (millionths of the currency)}.
-- The cost charged against a cost budget is capped the same way as tokens: at the cost
-- reserved and at the budget left.
-- Returns, per settlement, the tokens charged against the budget, or -1 when it had been
-- applied before.
local day_ttl, month_ttl, maxlen, refusal_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

-- Written once at the end (by key name).
local held_add, held_gone, window_add, spent_add, counters, days = {}, {}, {}, {}, {}, {}
local cost_held_add = {}
local streams = {}  -- the usage streams written to, trimmed to maxlen once at the end
-- Read once per batch, then kept as the batch changes them (by key name).
local budgets, spent, spent_ttl = {}, {}, {}

local function key_budget(name)  -- {budget or false, period or false}
  local f = budgets[name]
  if not f then
    local got = redis.call('HMGET', name, 'budget', 'period', 'cbudget', 'cperiod')
    f = {tonumber(got[1]) or false, got[2] or false, tonumber(got[3]) or false, got[4] or false}
    budgets[name] = f
  end
  return f
end

local function charge_spent(spent_key, ttl, amount, limit)  -- what is charged, capped
  local current = spent[spent_key]
  if not current then
    local got = redis.call('GET', spent_key)
    -- a period's counter gets its TTL once, when it starts
    spent_ttl[spent_key] = (ttl ~= 0 and not got) and ttl or false
    current = tonumber(got) or 0
  end
  amount = math.max(0, math.min(amount, limit - current))
  spent[spent_key] = current + amount
  spent_add[spent_key] = (spent_add[spent_key] or 0) + amount
  return amount
end

local function period_key(k, first, period)  -- the spent counter of a period, and its TTL
  if period == 'day' then
    return k[first + 1], day_ttl
  elseif period == 'month' then
    return k[first + 2], month_ttl
  end
  return k[first], 0
end

local function record(k, s, charge)  -- the day's counters and the usage stream entry
  local day_counters = counters[k[8]] or {}
  counters[k[8]] = day_counters
  for field, increment in pairs(s[6]) do
    day_counters[field] = (day_counters[field] or 0) + increment
  end
  local day_set = days[k[9]] or {}
  days[k[9]] = day_set
  day_set[s[5]] = true
  streams[k[10]] = true
  redis.call('XADD', k[10], '*', 'charged_tokens', charge,
             'ts', s[7], 'request_id', s[8], 'key_id', s[9], 'model', s[10],
             'provider', s[11], 'route_model', s[12], 'thinking', s[13],
             'route_reason', s[14], 'route', s[15], 'prompt_tokens', s[16],
             'completion_tokens', s[17], 'reasoning_tokens', s[18], 'cached_tokens', s[19],
             'max_tokens', s[20], 'reserved_tokens', s[21], 'latency_ms', s[22],
             'ttft_ms', s[23], 'status', s[24], 'error_code', s[25], 'cost', s[26])
end

local function settle(k, s)
  local token, reserved, used = s[2], s[3], s[4]
  if reserved < 0 then  -- a refusal
    if not redis.call('SET', k[4], 1, 'NX', 'PX', refusal_ttl) then
      return -1
    end
    record(k, s, 0)
    return 0
  end
  if redis.call('ZREM', k[2], token) == 1 then
    local amount = redis.call('HGET', k[3], token)
    if amount then
      held_add[k[3]] = (held_add[k[3]] or 0) - tonumber(amount)
      local gone = held_gone[k[3]] or {}
      held_gone[k[3]] = gone
      gone[#gone + 1] = token
    end
    local cost = redis.call('HGET', k[3], '$' .. token)
    if cost then
      cost_held_add[k[3]] = (cost_held_add[k[3]] or 0) - tonumber(cost)
      local gone = held_gone[k[3]] or {}
      held_gone[k[3]] = gone
      gone[#gone + 1] = '$' .. token
    end
  elseif redis.call('HGET', k[11], token) == 'lapsed' then
    redis.call('HDEL', k[11], token)
  else
    return -1
  end

  local charge = math.min(used, reserved)
  window_add[k[4]] = (window_add[k[4]] or 0) + charge - reserved
  local f = key_budget(k[1])
  local budget = f[1]
  if budget then
    local spent_key, ttl = period_key(k, 5, f[2])
    charge = charge_spent(spent_key, ttl, charge, budget)
  else
    charge = 0
  end
  if f[3] then
    local spent_key, ttl = period_key(k, 12, f[4])
    charge_spent(spent_key, ttl, math.min(s[28], s[27]), f[3])
  end

  record(k, s, charge)
  return charge
end

local replies = each_item(ARGV[5], 14, settle)

for held, amount in pairs(held_add) do
  redis.call('HINCRBY', held, '_sum', amount)
end
for held, amount in pairs(cost_held_add) do
  redis.call('HINCRBY', held, '_csum', amount)
end
for held, gone in pairs(held_gone) do
  redis.call('HDEL', held, unpack(gone))
end
for window, amount in pairs(window_add) do
  if amount ~= 0 and redis.call('EXISTS', window) == 1 then
    redis.call('INCRBY', window, amount)
  end
end
for name, amount in pairs(spent_add) do
  redis.call('INCRBY', name, amount)
  if spent_ttl[name] then
    redis.call('PEXPIRE', name, spent_ttl[name])
  end
end
for day_hash, fields in pairs(counters) do
  for field, amount in pairs(fields) do
    redis.call('HINCRBY', day_hash, field, amount)
  end
end
for day_set, members in pairs(days) do
  for day in pairs(members) do
    redis.call('SADD', day_set, day)
  end
end
-- One exact trim per stream and call, not one per record: trimmed by each XADD, a full stream
-- cost Redis about a quarter more CPU per keyed request at 64 clients (benchmarks/redis_cost.py
-- --maxlen 1000: 32.1 against 25.7 us). Nobody sees the stream between these commands, so
-- after every call it holds at most maxlen records, as before.
if tonumber(maxlen) > 0 then
  for stream in pairs(streams) do
    redis.call('XTRIM', stream, 'MAXLEN', maxlen)
  end
end
return replies
