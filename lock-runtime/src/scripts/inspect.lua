-- Read the state of one lock of any kind; changes nothing.
-- KEYS[1] the lock (a mutex's string, the hash of the other kinds), KEYS[2] fence counter,
-- KEYS[3] waiting-services zset
-- Reply: {fields and values of the hash (flat; empty for a string), pttl, last token issued or
--         -1, the services currently registered as waiting, server clock in ms (the
--         read-write and semaphore kinds keep each hold's expiry as data, in that clock), the
--         string's value (nil for a hash)}
local t = redis.call('time')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = redis.call('get', KEYS[2])
local fields, value = {}, false
if redis.call('type', KEYS[1])['ok'] == 'string' then
  value = redis.call('get', KEYS[1])
else
  fields = redis.call('hgetall', KEYS[1])
end
return {
  fields,
  redis.call('pttl', KEYS[1]),
  last and tonumber(last) or -1,
  redis.call('zrangebyscore', KEYS[3], now_ms, '+inf'),
  now_ms,
  value,
}
