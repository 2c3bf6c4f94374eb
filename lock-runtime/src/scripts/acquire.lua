-- Acquire or re-enter one lock (an operation of ops.lua).
-- Lock hash; owner field; lease in ms; waiter horizon in ms ('0': the caller will not wait, do
-- not register it)
-- Returns three values: 1, token, 0: granted | 2, token, hold count: re-entered (tokens as
-- decimal text) | 0, ms, 0: held by another owner (or it is another service's turn) for about ms
local function acquire(lock, owner, lease, horizon)
  local queue = lock .. $QUEUE_SUFFIX
  -- 0: free and nobody waits anywhere (a pending turn keeps its service registered): take it;
  -- 2: held (and waited for); 1: one of the two, ask which
  local busy = redis.call('exists', lock, queue)
  if busy == 0 then
    return 1, grant(lock, owner, lease), 0
  end

  if busy == 1 and redis.call('exists', lock) == 0 then
    -- a release may have given the next turn to a waiting service: only it may take the lock
    -- until the turn runs out
    local turn_key = lock .. $TURN_SUFFIX
    local turn = redis.call('get', turn_key)
    if not turn or turn == service then
      local token = grant(lock, owner, lease)
      redis.call('zrem', queue, service)
      if turn then
        redis.call('del', turn_key)
      end
      return 1, token, 0
    end
    if horizon ~= '0' then
      register_waiter(queue, tonumber(horizon))
    end
    return 0, redis.call('pttl', turn_key), 0
  end

  if redis.call('hexists', lock, owner) == 1 then
    local count = redis.call('hincrby', lock, owner, 1)
    -- never shorten the lease an outer hold asked for
    if redis.call('pttl', lock) < tonumber(lease) then
      redis.call('pexpire', lock, lease)
    end
    return 2, redis.call('hget', lock, ':fence'), count
  end

  if horizon ~= '0' then
    register_waiter(queue, tonumber(horizon))
  end
  return 0, redis.call('pttl', lock), 0
end
