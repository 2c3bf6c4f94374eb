-- Release one hold of a lock (an operation of ops.lua). On the last one: hand it to the next
-- waiter of the releasing service when no other service waits; else give the next turn to the
-- longest-registered other service (only it may take the lock for turn_ms) and tell it on the
-- wake-up channel.
-- Lock hash; owner field; next owner field ('' for none); next owner's lease in ms
-- Returns three values: 0, 0, 0: not held by this owner | 1, remaining holds, 0 | 2, 0, 0:
-- freed | 2, 1, 0: freed, the turn went to another service | 3, token, 0: handed to the next
-- owner (the token as decimal text)
local function release(lock, owner, next_owner, next_lease)
  local count = redis.call('hget', lock, owner)
  if not count then
    return 0, 0, 0
  end
  count = tonumber(count) - 1
  if count > 0 then
    redis.call('hset', lock, owner, count)
    return 1, count, 0
  end

  redis.call('del', lock)
  local queue = lock .. $QUEUE_SUFFIX
  if redis.call('exists', queue) == 0 then
    -- nobody registered as waiting anywhere
    if next_owner ~= '' then
      return 3, grant(lock, next_owner, next_lease), 0
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
      return 3, grant(lock, next_owner, next_lease), 0
    end
    redis.call($PUBLISH, channel, '0')
    return 2, 0, 0
  end
  -- the target must claim its turn by acquiring; if it does not (gone), the turn runs out and
  -- so does its registration, which keeps the waiting set (and so the turn check) alive until
  -- then
  redis.call('set', lock .. $TURN_SUFFIX, target, 'px', $TURN_MS)
  redis.call('zadd', queue, 'xx', now_ms() + $TURN_MS, target)
  if redis.call('pttl', queue) < $TURN_MS then
    redis.call('pexpire', queue, $TURN_MS)
  end
  if next_owner ~= '' then
    register_waiter(queue, $YIELD_HORIZON)
  end
  redis.call($PUBLISH, channel, target)
  return 2, 1, 0
end
