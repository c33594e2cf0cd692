-- The record JSON of the key whose secret has this digest, or false.
-- KEYS[1]: key-digest:{sha256}   ARGV[1]: the prefix of key hashes ("{prefix}key:")
local id = redis.call('GET', KEYS[1])
if not id then
  return false
end
return redis.call('HGET', ARGV[1] .. id, 'record')
