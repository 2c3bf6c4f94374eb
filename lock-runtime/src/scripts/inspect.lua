-- Read the state of one lock of any kind; changes nothing.
-- KEYS[1] lock hash, KEYS[2] fence counter, KEYS[3] waiting-services zset
-- Reply: {fields and values of the hash (flat), pttl, last token issued or -1,
--         number of services currently registered as waiting, server clock in ms (the
--         read-write and semaphore kinds keep each hold's expiry as data, in that clock)}
local t = redis.call('time')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = redis.call('get', KEYS[2])
return {
  redis.call('hgetall', KEYS[1]),
  redis.call('pttl', KEYS[1]),
  last and tonumber(last) or -1,
  redis.call('zcount', KEYS[3], now_ms, '+inf'),
  now_ms,
}
