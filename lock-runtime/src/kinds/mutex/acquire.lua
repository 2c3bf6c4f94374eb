-- The mutex kind: acquire, re-enter or confirm one lock (an operation of ops.lua; the value's
-- layout is in value.lua).
-- Lock key, fence counter, waiting-services zset, waiting heads (see value.lua); owner field; grant id of this
-- attempt (16 hex digits); lease in ms; waiter horizon in ms ('0': the caller will not wait, do
-- not register it; '-1': confirm a hold the owner has under this grant id, never grant); extra
-- (unused); fresh: this service is not registered as waiting for the lock (ops.lua's 'f')
-- Returns three values: 1, token, 0: granted to this attempt | 2, token, grants: the owner
-- holds it under this grant id (a confirmed re-entry, or this very attempt run before), or, for
-- an owner that is the same in every process ('mesh:' fields), a grant of another process that
-- this one now shares | 0, ms, 0: held by another owner or generation (or it is another
-- service's turn) for about ms. Tokens are decimal text or integers (the client reads both;
-- converting text to a number costs Redis a string-to-float parse).
local function acquire(lock, fence_key, queue, heads, owner, grant_id, lease, horizon, _, fresh)
  local lease_ms = checked_lease(lease)
  if fresh and horizon ~= '-1' then
    -- the uncontended case in one write: a free lock is taken at once. Its state is 'H' also
    -- when other services are still registered (their registrations outlived a lease or a
    -- turn that ran out): their next attempt, due by then, finds it held and marks it 'W'.
    -- This service is not registered, so there is no registration of its own to remove. A
    -- lock that is taken costs the token drawn for it (tokens only need to increase).
    local token = next_token(fence_key)
    if redis.call('set', lock, held('H', token, grant_id, owner), 'nx', 'px', lease_ms) then
      return 1, token, 0
    end
  end
  local v = redis.call('get', lock)
  if not v then
    if horizon == '-1' then
      return 0, -2, 0
    end
    -- free, and no turn reserved: whoever asks first takes it. This service no longer counts
    -- as waiting; others still registered (a turn ran out unclaimed, a lease ran out) make its
    -- release give the next turn.
    local token = next_token(fence_key)
    local state = 'H'
    if redis.call('exists', queue) == 1 then
      redis.call('zrem', queue, service)
      if redis.call('exists', queue) == 1 then
        state = 'W'
      else
        redis.call('del', heads)
      end
    end
    redis.call('set', lock, held(state, token, grant_id, owner), 'px', lease_ms)
    return 1, token, 0
  end

  local state, token, ids, holder = parts(v)
  if holder == owner and state ~= 'T' then
    if ids == grant_id or string.find(ids, grant_id, 1, true) then
      -- a confirmation, this attempt ran before (its reply was lost), or another service's
      -- release granted it to this waiter (for a short claim window): the same grant, whose
      -- lease the caller counts from this call's sending. Never shorten the lease an outer
      -- hold asked for.
      if redis.call('pttl', lock) < lease_ms then
        redis.call('pexpire', lock, lease_ms)
      end
      return 2, tonumber(token), 1
    end
    if horizon ~= '-1' and string.sub(owner, 1, 5) == 'mesh:' then
      ids = ids .. ' ' .. grant_id
      redis.call('set', lock, state .. token .. ids .. '|' .. owner, 'keepttl')
      if redis.call('pttl', lock) < lease_ms then
        redis.call('pexpire', lock, lease_ms)
      end
      return 2, tonumber(token), (#ids + 1) / 17
    end
    -- an earlier generation of this owner that the client no longer counts on: it expires
  end
  if horizon == '-1' then
    return 0, redis.call('pttl', lock), 0
  end

  if state == 'T' and holder == service then
    -- the turn a release gave this service: take it; other services still registered make
    -- its release look for the next turn
    local token = next_token(fence_key)
    redis.call('zrem', queue, service)
    local next_state = 'H'
    if redis.call('exists', queue) == 1 then
      next_state = 'W'
    else
      redis.call('del', heads)
    end
    redis.call('set', lock, held(next_state, token, grant_id, owner), 'px', lease_ms)
    return 1, token, 0
  end

  if horizon ~= '0' then
    local registered = register_waiter(queue, tonumber(horizon))
    note_head(heads, grant_id, lease_ms, owner, tonumber(horizon), registered)
    if state == 'H' then
      redis.call('setrange', lock, 0, 'W')
    end
  end
  return 0, redis.call('pttl', lock), 0
end
