-- Remove a lock of any kind whoever holds it, drop a mutex's pending turn, and wake its waiters.
-- KEYS[1] lock hash, KEYS[2] (mutex only) turn marker; ARGV[1] wake-up channel, ARGV[2]
-- 'publish' or 'spublish'
-- Reply: {fields and values of the hash as it was removed (flat; empty when there was none),
--         its pttl then, server clock in ms}
local t = redis.call('time')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fields = redis.call('hgetall', KEYS[1])
local pttl = redis.call('pttl', KEYS[1])
if redis.call('del', KEYS[1]) == 1 then
  if KEYS[2] then
    redis.call('del', KEYS[2])
  end
  redis.call(ARGV[2], ARGV[1], '0')
end
return {fields, pttl, now_ms}
