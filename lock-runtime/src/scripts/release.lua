-- Release one hold of a lock; on the last one free it, or hand it to the next waiter of the
-- releasing service when no other service is waiting for it.
-- KEYS[1] lock hash, KEYS[2] fence counter, KEYS[3] waiting-services zset
-- ARGV[1] owner field, ARGV[2] service id, ARGV[3] wake-up channel, ARGV[4] 'publish' or
-- 'spublish', ARGV[5] next owner field ('' for none), ARGV[6] next owner's lease in ms,
-- ARGV[7] horizon in ms to keep this service registered as waiting when it yields
-- Reply: {0} not held by this owner | {1, remaining holds} | {2, 0} freed |
--        {2, 1} freed, yielding to another service | {3, token} handed to the next owner
local lock, fence_key, queue = KEYS[1], KEYS[2], KEYS[3]
local owner, service, channel, publish = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local count = redis.call('hget', lock, owner)
if not count then
  return {0}
end
count = tonumber(count) - 1
if count > 0 then
  redis.call('hset', lock, owner, count)
  return {1, count}
end

redis.call('del', lock)
local next_owner = ARGV[5]
if next_owner ~= '' then
  redis.call('zremrangebyscore', queue, '-inf', math.floor(now_micros() / 1000))
  local others = redis.call('zcard', queue)
  if redis.call('zscore', queue, service) then
    others = others - 1
  end
  if others == 0 then
    return {3, grant(lock, next_owner, tonumber(ARGV[6]), fence_key)}
  end
  -- other services wait too: give them a turn, and keep our own waiters in line
  register_waiter(queue, service, tonumber(ARGV[7]))
  redis.call(publish, channel, '1')
  return {2, 1}
end
if redis.call('exists', queue) == 1 then
  redis.call(publish, channel, '0')
end
return {2, 0}
