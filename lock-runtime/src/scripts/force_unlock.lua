-- Remove a lock of any kind whoever holds it (a mutex's reserved turn with it), and wake its
-- waiters.
-- KEYS[1] the lock (a mutex's string, the hash of the other kinds); ARGV[1] wake-up channel,
-- ARGV[2] 'publish' or 'spublish'
-- Reply: {fields and values of the hash as it was removed (flat; empty for a string or when
--         there was none), its pttl then, server clock in ms, the string's value (nil for a
--         hash or when there was none)}
local t = redis.call('time')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fields, value = {}, false
if redis.call('type', KEYS[1])['ok'] == 'string' then
  value = redis.call('get', KEYS[1])
else
  fields = redis.call('hgetall', KEYS[1])
end
local pttl = redis.call('pttl', KEYS[1])
if redis.call('del', KEYS[1]) == 1 then
  redis.call(ARGV[2], ARGV[1], '0')
end
return {fields, pttl, now_ms, value}
