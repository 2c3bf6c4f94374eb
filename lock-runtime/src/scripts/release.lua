-- Release one hold of a lock. On the last one: hand it to the next waiter of the releasing
-- service when no other service waits; else give the next turn to the longest-registered other
-- service (only it may take the lock for ARGV[8] ms) and tell it on the wake-up channel.
-- KEYS[1] lock hash, KEYS[2] fence counter, KEYS[3] waiting-services zset, KEYS[4] turn marker
-- ARGV[1] owner field, ARGV[2] service id, ARGV[3] wake-up channel, ARGV[4] 'publish' or
-- 'spublish', ARGV[5] next owner field ('' for none), ARGV[6] next owner's lease in ms,
-- ARGV[7] horizon in ms to keep this service registered when it yields, ARGV[8] turn in ms,
-- ARGV[9] fence counter idle TTL in ms (0: never expires)
-- Reply: {0} not held by this owner | {1, remaining holds} | {2, 0} freed |
--        {2, 1} freed, the turn went to another service | {3, token} handed to the next owner
local lock, fence_key, queue, turn_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, service, channel, publish = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local next_owner = ARGV[5]

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
if redis.call('exists', queue) == 0 then
  -- nobody registered as waiting anywhere
  if next_owner ~= '' then
    return {3, grant(lock, next_owner, tonumber(ARGV[6]), fence_key, tonumber(ARGV[9]))}
  end
  return {2, 0}
end

redis.call('zremrangebyscore', queue, '-inf', math.floor(now_micros() / 1000))
local target = nil
for _, waiting in ipairs(redis.call('zrange', queue, 0, 1)) do
  if waiting ~= service then
    target = waiting
    break
  end
end
if not target then
  if next_owner ~= '' then
    return {3, grant(lock, next_owner, tonumber(ARGV[6]), fence_key, tonumber(ARGV[9]))}
  end
  redis.call(publish, channel, '0')
  return {2, 0}
end
-- the target must claim its turn by acquiring; if it does not (gone), the turn runs out and
-- so does its registration, which keeps the waiting set (and so the turn check) alive until then
local turn_ms = tonumber(ARGV[8])
redis.call('set', turn_key, target, 'px', turn_ms)
redis.call('zadd', queue, 'xx', math.floor(now_micros() / 1000) + turn_ms, target)
if redis.call('pttl', queue) < turn_ms then
  redis.call('pexpire', queue, turn_ms)
end
if next_owner ~= '' then
  register_waiter(queue, service, tonumber(ARGV[7]))
end
redis.call(publish, channel, target)
return {2, 1}
