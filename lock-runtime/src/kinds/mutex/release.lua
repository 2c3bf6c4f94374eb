-- The mutex kind: release one grant of a lock (an operation of ops.lua; the value's layout is
-- in value.lua). When no grant is left: hand it to the next waiter of the releasing service
-- when no other service waits; else grant it to the head waiter of the longest-registered
-- other service, for a claim window of $TURN_MS ms that its holder lengthens to its lease, and
-- tell it on the wake-up channel:
--   service .. '\n' .. grant id .. '\n' .. token .. '\n' .. sent .. '\n' .. us .. '\n' .. owner
-- (`sent` as the head noted it, `us` the server microseconds since it was noted); a service that
-- noted no head gets the next turn instead (only it may take the lock for $TURN_MS), told by
-- its id alone.
-- Lock key, fence counter, waiting-services zset, waiting heads; owner field; grant id; next owner
-- field ('' for none); its grant id; its lease in ms, or, with no next owner, how long in ms the
-- lock stays taken after this release frees it ('0': it is freed; else it is kept, by nobody,
-- for a minimum hold: 'T' .. token .. '|done:' .. owner field, which nobody can take, renew or
-- release, and which expires by itself - see value.lua); in_turn: the releasing service's turn
-- with the lock goes on (ops.lua's 'k'), so the next owner gets it even when others wait
-- Returns three values: 0, 0, 0: not held under this grant id (so running a release twice
-- changes nothing the second time) | 1, remaining grants, 0 | 2, 0, 0: freed | 2, 1, 0: freed,
-- the turn went to another service | 3, token, 0: handed to the next owner (decimal text)
local function release(lock, fence_key, queue, heads, owner, grant_id, next_owner, next_id,
                       next_lease, in_turn)
  local next_ms, keep_ms = 0, 0
  if next_owner ~= '' then
    next_ms = checked_lease(next_lease)
  elseif next_lease ~= '0' and next_lease ~= '' then
    keep_ms = checked_lease(next_lease)
  end
  -- the value fast.lua read for this operation, if it did (a lone release)
  local v = read_first
  read_first = nil
  if v == nil then
    v = redis.call('get', lock)
  end
  if not v then
    return 0, 0, 0
  end
  local state
  if string.sub(v, 18) == grant_id .. '|' .. owner then
    -- the one grant of its owner (the common case: no parsing)
    state = string.sub(v, 1, 1)
  else
    local token, ids, holder
    state, token, ids, holder = parts(v)
    if holder ~= owner or state == 'T' or not string.find(ids, grant_id, 1, true) then
      return 0, 0, 0
    end
    -- an owner shared by several processes: the others still hold it
    local rest = {}
    for id in string.gmatch(ids, '%x+') do
      if id ~= grant_id then
        rest[#rest + 1] = id
      end
    end
    redis.call('set', lock, state .. token .. table.concat(rest, ' ') .. '|' .. owner, 'keepttl')
    return 1, #rest, 0
  end

  if keep_ms > 0 then
    -- a minimum hold: kept, by nobody, until it expires; waiters of other services look again
    -- and find how long
    redis.call('set', lock, 'T' .. string.sub(v, 2, 17) .. '|done:' .. owner, 'px', keep_ms)
    if state == 'W' then
      redis.call($PUBLISH, lock .. $CHANNEL_SUFFIX, '0')
    end
    return 2, 0, 0
  end

  -- the longest-registered other service whose registration did not run out, and whether
  -- anyone else is registered (the three first registrations tell; registrations that ran out,
  -- of services that went away, are removed when one of them did)
  local target, others = nil, false
  if state == 'W' and in_turn and next_owner ~= '' then
    -- the releasing service's turn goes on: its next waiter, the others still waiting
    local handed = next_token(fence_key)
    redis.call('set', lock, held('W', handed, next_id, next_owner), 'px', next_ms)
    return 3, handed, 0
  end
  if state == 'W' then
    local now = now_ms()
    local first = redis.call('zrange', queue, 0, 2, 'withscores')
    while #first > 0 and tonumber(first[2]) <= now do
      for i = 1, #first, 2 do
        if tonumber(first[i + 1]) <= now then
          redis.call('zrem', queue, first[i])
        end
      end
      first = redis.call('zrange', queue, 0, 2, 'withscores')
    end
    for i = 1, #first, 2 do
      if not target and first[i] ~= service then
        target = first[i]
      else
        others = true
      end
    end
  end
  if not target then
    -- nobody else waits: the next waiter of this service, or free
    if next_owner ~= '' then
      local handed = next_token(fence_key)
      redis.call('set', lock, held('H', handed, next_id, next_owner), 'px', next_ms)
      return 3, handed, 0
    end
    redis.call('del', lock)
    if state == 'W' then
      redis.call($PUBLISH, lock .. $CHANNEL_SUFFIX, '0')
    end
    return 2, 0, 0
  end
  local head = redis.call('hget', heads, target)
  local head_id, head_lease, head_sent, noted, head_owner
  if head then
    head_id, head_lease, head_sent, noted, head_owner =
      string.match(head, '^(%x+) (%d+) (%d+) (%d+) (.*)')
  end
  if head_id then
    -- granted to the target's head at once, for the claim window; if nobody claims it (the
    -- service is gone), it runs out like a turn. The target no longer waits; this service
    -- waits behind the others when a waiter of it is next.
    local token = next_token(fence_key)
    local since = tonumber(clock_us()) - tonumber(noted)
    redis.call('zrem', queue, target)
    local state = 'H'
    if next_owner ~= '' then
      local registered = register_waiter(queue, $YIELD_HORIZON)
      note_head(heads, next_id, next_ms, next_owner, $YIELD_HORIZON, registered)
      state = 'W'
    elseif others then
      state = 'W'
    else
      redis.call('del', heads)
    end
    redis.call('set', lock, held(state, token, head_id, head_owner), 'px',
      math.min(tonumber(head_lease), $TURN_MS))
    redis.call($PUBLISH, lock .. $CHANNEL_SUFFIX, target .. '\n' .. head_id .. '\n' .. token ..
      '\n' .. head_sent .. '\n' .. math.max(since, 0) .. '\n' .. head_owner)
    return 2, 1, 0
  end
  -- the target must claim its turn by acquiring; if it does not (gone), the turn runs out and
  -- so does its registration
  redis.call('set', lock, 'T0000000000000000|' .. target, 'px', $TURN_MS)
  redis.call('zadd', queue, 'xx', now_ms() + $TURN_MS, target)
  if next_owner ~= '' then
    -- registered for longer than the turn lasts
    local registered = register_waiter(queue, $YIELD_HORIZON)
    note_head(heads, next_id, next_ms, next_owner, $YIELD_HORIZON, registered)
  elseif redis.call('pttl', queue) < $TURN_MS then
    redis.call('pexpire', queue, $TURN_MS)
  end
  redis.call($PUBLISH, lock .. $CHANNEL_SUFFIX, target)
  return 2, 1, 0
end
