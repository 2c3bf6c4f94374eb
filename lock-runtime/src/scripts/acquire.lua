-- Acquire or re-enter a lock.
-- KEYS[1] lock hash, KEYS[2] fence counter, KEYS[3] waiting-services zset, KEYS[4] turn marker
-- ARGV[1] owner field, ARGV[2] lease in ms, ARGV[3] service id,
-- ARGV[4] waiter horizon in ms (0: the caller will not wait, do not register it),
-- ARGV[5] fence counter idle TTL in ms (0: never expires)
-- Reply: {1, token} granted | {2, token, hold count} re-entered |
--        {0, ms} held by another owner (or it is another service's turn) for about ms
local lock, fence_key, queue, turn_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, lease, service = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local fence_ttl = tonumber(ARGV[5])

-- 0: free and nobody waits anywhere (a pending turn keeps its service registered): take it;
-- 2: held (and waited for); 1: one of the two, ask which
local busy = redis.call('exists', lock, queue)
if busy == 0 then
  return {1, grant(lock, owner, lease, fence_key, fence_ttl)}
end

if busy == 1 and redis.call('exists', lock) == 0 then
  -- a release may have given the next turn to a waiting service: only it may take the lock
  -- until the turn runs out
  local turn = redis.call('get', turn_key)
  if not turn or turn == service then
    local token = grant(lock, owner, lease, fence_key, fence_ttl)
    redis.call('zrem', queue, service)
    if turn then
      redis.call('del', turn_key)
    end
    return {1, token}
  end
  if tonumber(ARGV[4]) > 0 then
    register_waiter(queue, service, tonumber(ARGV[4]))
  end
  return {0, redis.call('pttl', turn_key)}
end

if redis.call('hexists', lock, owner) == 1 then
  local count = redis.call('hincrby', lock, owner, 1)
  -- never shorten the lease an outer hold asked for
  if redis.call('pttl', lock) < lease then
    redis.call('pexpire', lock, lease)
  end
  return {2, tonumber(redis.call('hget', lock, ':fence')), count}
end

if tonumber(ARGV[4]) > 0 then
  register_waiter(queue, service, tonumber(ARGV[4]))
end
return {0, redis.call('pttl', lock)}
