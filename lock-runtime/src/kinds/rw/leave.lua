-- A writer of a service stopped waiting for a read-write lock (its wait ran out, it failed or
-- its caller went away) and no other writer of that service waits: the service is no longer
-- counted among the writers waiting, and when no writer waits any more, the readers that were
-- kept out for them are woken (they sleep until a wake-up, see read.lua).
-- KEYS[1] writers waiting (zset), KEYS[2] services waiting (zset); ARGV[1] service id,
-- ARGV[2] wake-up channel, ARGV[3] 'publish' or 'spublish'
-- Reply: 1 when the service was registered, 0 otherwise
if redis.call('zrem', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('zcount', KEYS[1], now, '+inf') == 0 and redis.call('exists', KEYS[2]) == 1 then
  redis.call(ARGV[3], ARGV[2], '0')
end
return 1
