-- The mutex kind: acquire, re-enter or confirm one lock (an operation of ops.lua).
-- Lock hash, fence counter, waiting-services zset, turn marker; owner field; grant id of this
-- attempt (16 hex digits); lease in ms; waiter horizon in ms ('0': the caller will not wait, do
-- not register it; '-1': confirm a hold the owner has under this grant id, never grant); extra
-- (unused)
-- Returns three values: 1, token, 0: granted to this attempt | 2, token, grants: the owner
-- holds it under this grant id (a confirmed re-entry, or this very attempt run before), or, for
-- an owner that is the same in every process ('mesh:' fields), a grant of another process that
-- this one now shares (tokens as decimal text) | 0, ms, 0: held by another owner or generation
-- (or it is another service's turn) for about ms
local function acquire(lock, fence_key, queue, turn_key, owner, grant_id, lease, horizon, _)
  local lease_ms = checked_lease(lease)
  if horizon == '-1' then
    local held = redis.call('hget', lock, owner)
    if held and string.find(held, grant_id, 1, true) then
      -- never shorten the lease an outer hold asked for
      if redis.call('pttl', lock) < lease_ms then
        redis.call('pexpire', lock, lease_ms)
      end
      return 2, redis.call('hget', lock, ':fence'), 1
    end
    return 0, redis.call('pttl', lock), 0
  end

  -- 0: free and nobody waits anywhere (a pending turn keeps its service registered): take it;
  -- 2: held (and waited for); 1: one of the two, ask which
  local busy = redis.call('exists', lock, queue)
  if busy == 0 then
    return 1, grant(lock, fence_key, owner, grant_id, lease_ms), 0
  end

  if busy == 1 and redis.call('exists', lock) == 0 then
    -- a release may have given the next turn to a waiting service: only it may take the lock
    -- until the turn runs out
    local turn = redis.call('get', turn_key)
    if not turn or turn == service then
      local token = grant(lock, fence_key, owner, grant_id, lease_ms)
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

  local held = redis.call('hget', lock, owner)
  if held then
    if string.find(held, grant_id, 1, true) then
      -- this attempt ran before (its reply was lost): the same grant, nothing changes
      return 2, redis.call('hget', lock, ':fence'), 1
    end
    if string.sub(owner, 1, 5) == 'mesh:' then
      held = held .. ' ' .. grant_id
      redis.call('hset', lock, owner, held)
      if redis.call('pttl', lock) < lease_ms then
        redis.call('pexpire', lock, lease_ms)
      end
      return 2, redis.call('hget', lock, ':fence'), (#held + 1) / 17
    end
    -- an earlier generation of this owner that the client no longer counts on: it expires
  end

  if horizon ~= '0' then
    register_waiter(queue, tonumber(horizon))
  end
  return 0, redis.call('pttl', lock), 0
end
