-- A service has no waiters left for a lock: stop counting it as waiting.
-- KEYS[1] waiting-services zset, KEYS[2] (optional) the waiting services' heads of a mutex (see
-- kinds/mutex/value.lua), deleted with the last registration; ARGV[1] service id
-- Reply: 1 when it was registered, 0 otherwise
local left = redis.call('zrem', KEYS[1], ARGV[1])
if KEYS[2] and redis.call('exists', KEYS[1]) == 0 then
  redis.call('del', KEYS[2])
end
return left
