-- How a batched script's items arrive (script_batch.batch_call): the source of admit.lua and
-- settle.lua each start with this one (store.batched_lua).
-- `packed`: the MessagePack array of items, each {where its keys start in KEYS (0-based), its
-- values...}; `width`: how many keys each item has. Calls `each(keys, item)` for every item in
-- order, `keys` a table of the item's keys (built once for the items that share them); returns
-- what each call returned, in order.
local function each_item(packed, width, each)
  local replies, items, named = {}, cmsgpack.unpack(packed), {}
  for i = 1, #items do
    local item = items[i]
    local base = item[1]
    local k = named[base]
    if not k then
      k = {}
      for j = 1, width do
        k[j] = KEYS[base + j]
      end
      named[base] = k
    end
    replies[i] = each(k, item)
  end
  return replies
end

