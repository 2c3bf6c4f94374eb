-- The mutex kind: release one grant of a lock (an operation of ops.lua). When no grant is left: hand it to the
-- next waiter of the releasing service when no other service waits; else give the next turn to
-- the longest-registered other service (only it may take the lock for turn_ms) and tell it on
-- the wake-up channel.
-- Lock hash, fence counter, waiting-services zset, turn marker; owner field; grant id; next
-- owner field ('' for none); its grant id; its lease in ms
-- Returns three values: 0, 0, 0: not held under this grant id (so running a release twice
-- changes nothing the second time) | 1, remaining grants, 0 | 2, 0, 0: freed | 2, 1, 0: freed,
-- the turn went to another service | 3, token, 0: handed to the next owner (the token as
-- decimal text)
local function release(lock, fence_key, queue, turn_key, owner, grant_id, next_owner, next_id,
                       next_lease)
  local next_ms = 0
  if next_owner ~= '' then
    next_ms = checked_lease(next_lease)
  end
  local held = redis.call('hget', lock, owner)
  if not held or not string.find(held, grant_id, 1, true) then
    return 0, 0, 0
  end
  if #held > #grant_id then
    -- an owner shared by several processes: the others still hold it
    local rest = {}
    for id in string.gmatch(held, '%x+') do
      if id ~= grant_id then
        rest[#rest + 1] = id
      end
    end
    redis.call('hset', lock, owner, table.concat(rest, ' '))
    return 1, #rest, 0
  end

  redis.call('del', lock)
  if redis.call('exists', queue) == 0 then
    -- nobody registered as waiting anywhere
    if next_owner ~= '' then
      return 3, grant(lock, fence_key, next_owner, next_id, next_ms), 0
    end
    return 2, 0, 0
  end

  local channel = lock .. $CHANNEL_SUFFIX
  redis.call('zremrangebyscore', queue, '-inf', now_ms())
  local target = nil
  for _, waiting in ipairs(redis.call('zrange', queue, 0, 1)) do
    if waiting ~= service then
      target = waiting
      break
    end
  end
  if not target then
    if next_owner ~= '' then
      return 3, grant(lock, fence_key, next_owner, next_id, next_ms), 0
    end
    redis.call($PUBLISH, channel, '0')
    return 2, 0, 0
  end
  -- the target must claim its turn by acquiring; if it does not (gone), the turn runs out and
  -- so does its registration, which keeps the waiting set (and so the turn check) alive until
  -- then
  redis.call('set', turn_key, target, 'px', $TURN_MS)
  redis.call('zadd', queue, 'xx', now_ms() + $TURN_MS, target)
  if next_owner ~= '' then
    -- registered for longer than the turn lasts: the set outlives the turn either way
    register_waiter(queue, $YIELD_HORIZON)
  elseif redis.call('pttl', queue) < $TURN_MS then
    redis.call('pexpire', queue, $TURN_MS)
  end
  redis.call($PUBLISH, channel, target)
  return 2, 1, 0
end
