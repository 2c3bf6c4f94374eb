-- The read-write kind's read hold (see state.lua): acquire and release, as ops.lua calls them.
-- acquire: hash, fence counter, services waiting, writers waiting; owner field; grant id; lease
-- in ms; waiter horizon in ms ('0': do not register, '-1': confirm, never grant); extra (unused)
local function acquire(lock, fence_key, queue, writers, owner, grant_id, lease, horizon, _)
  local lease_ms = checked_lease(lease)
  local field = 'r:' .. grant_id
  local writer, _, wexp, _, latest = rw_state(lock)
  local mine = redis.call('hget', lock, field)
  if mine then
    local old, token = string.match(mine, '^(%d+) (%d+) ')
    if not token then
      -- a share written without its token (by an older version): a token of its own now
      old, token = string.match(mine, '^%d+'), next_token(fence_key)
    end
    if horizon == '-1' then
      local exp = now_ms() + lease_ms
      if exp > (tonumber(old) or 0) then
        redis.call('hset', lock, field, string.format('%d %s %s', exp, token, owner))
        rw_expire(lock, math.max(exp, latest))
      end
    end
    return 2, token, 1
  end
  if horizon == '-1' then
    return 0, redis.call('pttl', lock), 0
  end
  local own_write = writer == 'w:' .. owner
  if (writer and not own_write) or (not own_write and writers_waiting(writers)) then
    if horizon ~= '0' then
      register_waiter(queue, tonumber(horizon))
    end
    -- look again when the holds in force run out (a writer's, or the shares a waiting writer
    -- waits for); a release that frees the lock, and the last waiting writer giving up,
    -- publish a wake-up before that
    local hint = math.max(latest - now_ms(), 1)
    if writer then
      hint = math.max(wexp - now_ms(), 1)
      return 0, hint, 0
    end
    -- refused only because writers wait: a writer behind this reader may be granted now (the
    -- one waiting elsewhere may be gone, its registration not yet run out)
    return 0, hint, 1
  end
  -- the share's own token, never a write grant's (a downgrade shares its own write's token)
  local token
  if own_write then
    token = redis.call('hget', lock, ':fence')
  else
    token = next_token(fence_key)
  end
  local exp = now_ms() + lease_ms
  redis.call('hset', lock, field, string.format('%d %s %s', exp, token, owner))
  rw_expire(lock, math.max(exp, latest))
  return 1, token, 0
end

-- release: hash, fence counter, services waiting, writers waiting; owner field; grant id; the
-- next owner's field, grant id and lease (unused: no hand-off)
local function release(lock, _, queue, _, _, grant_id, _, _, _)
  if redis.call('hdel', lock, 'r:' .. grant_id) == 0 then
    return 0, 0, 0
  end
  local writer, _, _, readers, latest = rw_state(lock)
  rw_released(lock, queue, writer, readers, latest)
  if writer or readers > 0 then
    return 1, readers, 0
  end
  return 2, 0, 0
end
