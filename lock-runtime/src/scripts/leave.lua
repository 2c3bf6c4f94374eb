-- A service has no waiters left for a lock: stop counting it as waiting.
-- KEYS[1] waiting-services zset; ARGV[1] service id
-- Reply: 1 when it was registered, 0 otherwise
return redis.call('zrem', KEYS[1], ARGV[1])
