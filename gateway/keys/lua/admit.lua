-- Admit a batch of requests, one after the other: for each, check the key as it is now, reserve
-- the worst case against budget, TPM and concurrency, count it against RPM. For each request
-- either everything is reserved or nothing changes; each sees the ones before it in the batch.
-- What several requests of a batch read (a key's hash, its counters) is read once, and what
-- they write is written once at the end: a batch costs Redis far less than its requests would
-- one script call each.
-- KEYS: the keys of each request, once for the requests that name the same ones: 1 key:{id}
--   hash, 2 slots zset, 3 held hash, 4 rpm window, 5 tpm window, 6 spent (all), 7 spent (day),
--   8 spent (month), 9 gone hash, 10 spent cost (all), 11 spent cost (day), 12 spent cost
--   (month). Costs are counted in millionths of the currency, as integers.
-- ARGV: 1 slot lease (ms), 2 how long the slots, held and gone hashes outlive their last write
--   (ms), 3 the requests, packed with MessagePack (values arrive typed, with none of the cost of
--   an argument each): per request {where its keys start in KEYS (0-based), now (ms), request
--   token, prompt tokens, max_tokens, ms until the current minute window resets, the presented
--   secret's digest, model, cost of a prompt token, cost of an output token (millionths of the
--   currency: the worst case of the request's routes)}.
-- Returns one reply per request: {0, max_tokens granted, reserved, rpm, rpm left, tpm,
--   tpm left, cost reserved} (-1: no limit), {1, why} key refused (revoked, rotated, disabled,
--   expired), {2, budget left} over budget, {6, cost budget left, prompt cost} over the cost
--   budget, {3, retry ms, limit name, limit} rate limited, {4} model not
--   allowed for this key, {5} the gateway gave up on this admission and has already released
--   it (see release.lua).
local ttl, keep = tonumber(ARGV[1]), tonumber(ARGV[2])

-- Written once at the end (by key name): slot lease pairs, held pairs, window increments
-- (with the reset of the request that opened them).
local slots_new, held_new, held_add, window_add, window_reset = {}, {}, {}, {}, {}
local cost_add = {}  -- held cost to add (by held hash name)
-- Read once per batch (with what the batch is yet to write), then kept as the batch changes
-- them (by key name).
local fields, sums, csums, counts, busy = {}, {}, {}, {}, {}

local function key_fields(name)
  local f = fields[name]
  if not f then
    f = redis.call('HMGET', name, 'rpm', 'tpm', 'conc', 'budget', 'period',
                   'digest', 'disabled', 'expires_ms', 'models', 'cbudget', 'cperiod')
    fields[name] = f
  end
  return f
end

local function counter(name)  -- a GET counter as the batch has left it
  local v = counts[name]
  if not v then
    v = (tonumber(redis.call('GET', name)) or 0) + (window_add[name] or 0)
    counts[name] = v
  end
  return v
end

local function held_sum(name)
  local v = sums[name]
  if not v then
    v = (tonumber(redis.call('HGET', name, '_sum')) or 0) + (held_add[name] or 0)
    sums[name] = v
  end
  return v
end

local function held_cost(name)
  local v = csums[name]
  if not v then
    v = (tonumber(redis.call('HGET', name, '_csum')) or 0) + (cost_add[name] or 0)
    csums[name] = v
  end
  return v
end

local function slots_busy(name)
  local v = busy[name]
  if not v then
    v = redis.call('ZCARD', name) + #(slots_new[name] or {}) / 2
    busy[name] = v
  end
  return v
end

-- Slots past their lease belong to requests whose replica died or lost Redis for longer than
-- a lease: their slots and reservations are dropped when they would make a difference (a
-- refusal or a clipped max_tokens) and on about one admission in 32 (so they cannot pile up),
-- not on every one: until then they only make admission stricter. A dropped slot is noted as
-- 'lapsed' in the gone hash, so that its settlement, if it still comes, is recorded once.
-- Slots this batch adds are not in the zset yet, and their lease has not run out.
local function sweep(slots, held, gone, now)  -- the slots dropped and the tokens they held
  local expired = redis.call('ZRANGEBYSCORE', slots, '-inf', now)
  local freed, freed_cost = 0, 0
  for _, old in ipairs(expired) do
    redis.call('HSET', gone, old, 'lapsed')
    local amount = redis.call('HGET', held, old)
    if amount then
      freed = freed + tonumber(amount)
      redis.call('HDEL', held, old)
    end
    local cost = redis.call('HGET', held, '$' .. old)
    if cost then
      freed_cost = freed_cost + tonumber(cost)
      redis.call('HDEL', held, '$' .. old)
    end
  end
  if freed > 0 then
    redis.call('HINCRBY', held, '_sum', -freed)
    if sums[held] then sums[held] = sums[held] - freed end
  end
  if freed_cost > 0 then
    redis.call('HINCRBY', held, '_csum', -freed_cost)
    if csums[held] then csums[held] = csums[held] - freed_cost end
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
    redis.call('PEXPIRE', gone, keep)
    if busy[slots] then busy[slots] = busy[slots] - #expired end
  end
  return #expired, freed, freed_cost
end

local function admit(k, now, token, prompt, grant, reset, digest, model, cin, cout)
  if redis.call('HEXISTS', k[9], token) == 1 then
    return {5}
  end
  local f = key_fields(k[1])
  if not f[6] then
    return {1, 'revoked'}
  end
  if f[6] ~= digest then
    return {1, 'rotated'}
  end
  if f[7] then
    return {1, 'disabled'}
  end
  if f[8] and tonumber(f[8]) <= now then
    return {1, 'expired'}
  end
  if f[9] and not string.find(f[9], '\n' .. model .. '\n', 1, true) then
    return {4}
  end
  local rpm, tpm, conc, budget = tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
  local slots, held, gone = k[2], k[3], k[9]

  local swept = now % 32 == 0
  if swept then
    sweep(slots, held, gone, now)
  end
  if budget then
    local spent_key = k[6]
    if f[5] == 'day' then spent_key = k[7] elseif f[5] == 'month' then spent_key = k[8] end
    local left = budget - counter(spent_key) - held_sum(held)
    if left < prompt + grant and not swept then
      swept = true
      local _, freed = sweep(slots, held, gone, now)
      left = left + freed
    end
    if left <= prompt then
      return {2, math.max(left, 0)}
    end
    if left < prompt + grant then
      grant = left - prompt
    end
  end
  local cbudget = tonumber(f[10])
  if cbudget then
    -- The worst case costs prompt * cin + grant * cout; at least one output token must fit.
    local spent_key = k[10]
    if f[11] == 'day' then spent_key = k[11] elseif f[11] == 'month' then spent_key = k[12] end
    local left = cbudget - counter(spent_key) - held_cost(held)
    local base = prompt * cin
    if left < math.ceil(base + grant * cout) and not swept then
      swept = true
      local _, _, freed_cost = sweep(slots, held, gone, now)
      left = left + freed_cost
    end
    if left <= 0 or left < math.ceil(base + cout) then
      return {6, math.max(left, 0), math.ceil(base)}
    end
    if cout > 0 and left < math.ceil(base + grant * cout) then
      grant = math.max(1, math.floor((left - base) / cout))
      if grant > 1 and math.ceil(base + grant * cout) > left then grant = grant - 1 end
    end
  end
  if tpm and prompt + grant > tpm then
    if prompt >= tpm then
      return {3, reset, 'tpm_request', tpm}
    end
    grant = tpm - prompt
  end
  local need = prompt + grant
  local need_cost = 0
  if cbudget then need_cost = math.ceil(prompt * cin + grant * cout) end

  local requests = 0
  if rpm then
    requests = counter(k[4])
    if requests >= rpm then
      return {3, reset, 'rpm', rpm}
    end
  end
  local tokens = 0
  if tpm then
    tokens = counter(k[5])
    if tokens + need > tpm then
      return {3, reset, 'tpm', tpm}
    end
  end
  if conc then
    local taken = slots_busy(slots)
    if taken >= conc and not swept then
      taken = taken - sweep(slots, held, gone, now)
    end
    if taken >= conc then
      return {3, 1000, 'concurrency', conc}
    end
  end

  -- Admitted: what it reserves, as the rest of the batch is to see it and as it is written.
  local lease = slots_new[slots] or {}
  slots_new[slots] = lease
  lease[#lease + 1] = now + ttl
  lease[#lease + 1] = token
  if busy[slots] then busy[slots] = busy[slots] + 1 end
  if cbudget then  -- the cost reserved, under '$' .. token
    local pairs_ = held_new[held] or {}
    held_new[held] = pairs_
    pairs_[#pairs_ + 1] = '$' .. token
    pairs_[#pairs_ + 1] = need_cost
    cost_add[held] = (cost_add[held] or 0) + need_cost
    if csums[held] then csums[held] = csums[held] + need_cost end
  end
  if budget or tpm then  -- what the reservation is, for settlement and release
    local pairs_ = held_new[held] or {}
    held_new[held] = pairs_
    pairs_[#pairs_ + 1] = token
    pairs_[#pairs_ + 1] = need
    held_add[held] = (held_add[held] or 0) + need
    if sums[held] then sums[held] = sums[held] + need end
  end
  local rpm_left, tpm_left = -1, -1
  if rpm then
    counts[k[4]] = requests + 1
    window_add[k[4]] = (window_add[k[4]] or 0) + 1
    window_reset[k[4]] = window_reset[k[4]] or reset
    rpm_left = rpm - requests - 1
  end
  if tpm then
    counts[k[5]] = tokens + need
    window_add[k[5]] = (window_add[k[5]] or 0) + need
    window_reset[k[5]] = window_reset[k[5]] or reset
    tpm_left = tpm - tokens - need
  end
  return {0, grant, need, rpm or -1, rpm_left, tpm or -1, tpm_left, need_cost}
end

local replies = each_item(ARGV[3], 12, function(k, r)
  return admit(k, r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])
end)

for slots, lease in pairs(slots_new) do
  redis.call('ZADD', slots, unpack(lease))
  redis.call('PEXPIRE', slots, keep)
end
for held, pairs_ in pairs(held_new) do
  redis.call('HSET', held, unpack(pairs_))
  if held_add[held] then redis.call('HINCRBY', held, '_sum', held_add[held]) end
  if cost_add[held] then redis.call('HINCRBY', held, '_csum', cost_add[held]) end
  redis.call('PEXPIRE', held, keep)
end
for window, amount in pairs(window_add) do
  if redis.call('INCRBY', window, amount) == amount then  -- its TTL is set when it opens
    redis.call('PEXPIRE', window, window_reset[window] + 1000)
  end
end
return replies
