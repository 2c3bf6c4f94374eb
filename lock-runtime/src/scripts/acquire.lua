-- Acquire or re-enter a lock.
-- KEYS[1] lock hash, KEYS[2] fence counter, KEYS[3] waiting-services zset
-- ARGV[1] owner field, ARGV[2] lease in ms, ARGV[3] service id,
-- ARGV[4] waiter horizon in ms (0: the caller will not wait, do not register it)
-- Reply: {1, token} granted | {2, token, hold count} re-entered | {0, pttl} held by another owner
local lock, fence_key, queue = KEYS[1], KEYS[2], KEYS[3]
local owner, lease = ARGV[1], tonumber(ARGV[2])

if redis.call('exists', lock) == 0 then
  local token = grant(lock, owner, lease, fence_key)
  redis.call('zrem', queue, ARGV[3])
  return {1, token}
end

if redis.call('hexists', lock, owner) == 1 then
  local count = redis.call('hincrby', lock, owner, 1)
  -- never shorten the lease an outer hold asked for
  if redis.call('pttl', lock) < lease then
    redis.call('pexpire', lock, lease)
  end
  return {2, tonumber(redis.call('hget', lock, ':fence')), count}
end

local horizon = tonumber(ARGV[4])
if horizon > 0 then
  register_waiter(queue, ARGV[3], horizon)
end
return {0, redis.call('pttl', lock)}
