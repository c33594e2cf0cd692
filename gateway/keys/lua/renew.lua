-- Renew the leases of one process's live requests, every key in one call: a slot's deadline
-- moves to the new one; a slot no longer there (settled, swept) is not brought back.
-- KEYS: the slots zsets of the keys with live requests
-- ARGV: 1 new deadline (ms), then per key in KEYS order: n, then its n request tokens
-- Returns the number of slots renewed.
local deadline, at, renewed = ARGV[1], 2, 0
for i = 1, #KEYS do
  local n = tonumber(ARGV[at])
  for j = at + 1, at + n do
    renewed = renewed + redis.call('ZADD', KEYS[i], 'XX', 'CH', deadline, ARGV[j])
  end
  at = at + n + 1
end
return renewed
