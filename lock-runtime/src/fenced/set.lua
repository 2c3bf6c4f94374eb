-- Fenced write (lock_runtime::fenced): sets fields of a hash only when the writer's fencing token
-- is not older than the token of the last accepted write, which the hash keeps in the field
-- `fence`. The check and the write are one script run, so no other write comes between them.
--
-- KEYS[1]  the hash: the fields written so far and `fence`
-- ARGV[1]  the writer's token: a positive decimal integer below 2^64, no leading zeros
-- ARGV[2], ARGV[3], ...  field, value pairs to set (at least one; never the field `fence`)
--
-- Reply: {1, token}   written; `fence` is now ARGV[1]
--        {0, stored}  stale: the stored token is newer than ARGV[1]; nothing was written
--        error FENCEARG (bad argument) or FENCEKEY (the key holds no fenced data): nothing
--        was written
--
-- Tokens are compared as decimal strings (length first, then digits): Lua numbers are doubles
-- and would round tokens above 2^53.

local key = KEYS[1]
local token = ARGV[1]
local function is_token(s)
  return type(s) == 'string' and #s <= 20 and string.match(s, '^[1-9]%d*$') ~= nil
    and (#s < 20 or s <= '18446744073709551615')
end
if not is_token(token) then
  return redis.error_reply('FENCEARG the fencing token must be a positive integer below 2^64, got "'
    .. tostring(token) .. '"')
end
if #ARGV < 3 or #ARGV % 2 ~= 1 then
  return redis.error_reply('FENCEARG a fenced write needs field, value pairs (at least one)')
end
for i = 2, #ARGV, 2 do
  if ARGV[i] == 'fence' then
    return redis.error_reply('FENCEARG the field "fence" holds the fencing token and cannot be written')
  end
end
local kind = redis.call('TYPE', key).ok
if kind ~= 'none' and kind ~= 'hash' then
  return redis.error_reply('FENCEKEY ' .. key .. ' is a ' .. kind .. ', not a fenced hash')
end
local stored = redis.call('HGET', key, 'fence')
if stored then
  if not is_token(stored) then
    return redis.error_reply('FENCEKEY the field "fence" of ' .. key .. ' is "' .. stored
      .. '", not a fencing token')
  end
  if #stored > #token or (#stored == #token and stored > token) then
    return {0, stored}
  end
end
for i = 2, #ARGV, 2 do
  redis.call('HSET', key, ARGV[i], ARGV[i + 1])
end
redis.call('HSET', key, 'fence', token)
return {1, token}
