-- The read-write kind's write hold (see state.lua): acquire and release, as ops.lua calls them.
-- acquire: hash, fence counter, services waiting, writers waiting; owner field; grant id; lease
-- in ms; waiter horizon in ms ('0': do not register, '-1': confirm, never grant); extra (unused)
local function acquire(lock, fence_key, queue, writers, owner, grant_id, lease, horizon, _)
  local lease_ms = checked_lease(lease)
  local field = 'w:' .. owner
  local writer, wgrant, wexp, readers, latest = rw_state(lock)
  if writer == field and wgrant == grant_id then
    if horizon == '-1' then
      local exp = now_ms() + lease_ms
      if exp > wexp then
        redis.call('hset', lock, ':wexp', exp)
        if exp > latest then
          latest = exp
        end
        rw_expire(lock, latest)
      end
    end
    return 2, redis.call('hget', lock, ':fence'), 1
  end
  if horizon == '-1' then
    return 0, redis.call('pttl', lock), 0
  end
  if not writer and readers == 0 then
    local token = next_token(fence_key)
    local exp = now_ms() + lease_ms
    redis.call('hset', lock, field, grant_id, ':wexp', exp, ':fence', token)
    rw_expire(lock, math.max(exp, latest))
    redis.call('zrem', writers, service)
    redis.call('zrem', queue, service)
    return 1, token, 0
  end
  if horizon ~= '0' then
    local ms = tonumber(horizon)
    register_waiter(queue, ms)
    register_waiter(writers, ms)
  end
  return 0, math.max(latest - now_ms(), 1), 0
end

-- release: hash, fence counter, services waiting, writers waiting; owner field; grant id; the
-- next owner's field, grant id and lease (unused: no hand-off)
local function release(lock, _, queue, _, owner, grant_id, _, _, _)
  local field = 'w:' .. owner
  if redis.call('hget', lock, field) ~= grant_id then
    return 0, 0, 0
  end
  redis.call('hdel', lock, field, ':wexp', ':fence')
  local writer, _, _, readers, latest = rw_state(lock)
  rw_released(lock, queue, writer, readers, latest)
  return 2, 0, 0
end
