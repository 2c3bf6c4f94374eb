-- The semaphore kind: acquire and release permits, as ops.lua calls them.
--
-- A semaphore is a hash: ':n' -> how many permits it has (the latest count an acquirer
-- passed), and one field per grant 'p:<grant id>' -> '<expiry ms> <permits> @<token> <owner>'
-- (the token, the grant's own, tells its grant time: an older version wrote no '@<token>'). Leases
-- are kept as data: each grant expires on its own (a crashed holder's permits come back with
-- its lease) and the key's PEXPIRE is the latest of them. Keys: the hash, its fence counter,
-- the services waiting (a release publishes when it is not empty), and an unused fourth.

-- Reads the grants, dropping those whose lease ran out. Returns the permits in use, the
-- earliest and latest expiry of a live grant (0 when none), and whether the field `field` (if
-- given) is there.
local function sem_state(lock, field)
  local now = now_ms()
  local all = redis.call('hgetall', lock)
  local used, earliest, latest = 0, 0, 0
  local dead = {}
  local found = false
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if f == field then
      found = true
    end
    if string.sub(f, 1, 2) == 'p:' then
      local exp, n = string.match(v, '^(%d+) (%d+)')
      exp, n = tonumber(exp) or 0, tonumber(n) or 0
      if exp <= now then
        dead[#dead + 1] = f
      else
        used = used + n
        if earliest == 0 or exp < earliest then
          earliest = exp
        end
        if exp > latest then
          latest = exp
        end
      end
    end
  end
  if #dead > 0 then
    redis.call('hdel', lock, unpack(dead))
  end
  return used, earliest, latest, found
end

-- A grant's field value (see above); the numbers written as integers ('%d': concatenating a
-- number would format it as a float).
local function grant_value(exp, permits, token, owner)
  return string.format('%d %d @%s %s', exp, permits, token, owner)
end

-- acquire: hash, fence counter, services waiting, unused; owner field; grant id; lease in ms;
-- waiter horizon in ms ('0': do not register); extra: '<permits wanted> <permits in all>'
-- Replies as ops.lua documents; a refusal's third value is how many permits are free.
local function acquire(lock, fence_key, queue, _, owner, grant_id, lease, horizon, extra)
  local lease_ms = checked_lease(lease)
  local want, total_text = string.match(extra, '^(%d+) (%d+)$')
  local total
  want, total = tonumber(want), tonumber(total_text)
  if not want or want < 1 or not total or want > total then
    error('invalid permit counts ' .. tostring(extra))
  end
  local field = 'p:' .. grant_id
  local mine = redis.call('hget', lock, field)
  if mine then
    return 2, string.match(mine, '^%d+ %d+ @(%d+) ') or last_token(fence_key) or '0', 1
  end
  if horizon == '-1' then
    return 0, redis.call('pttl', lock), 0
  end
  local used, earliest, latest = sem_state(lock)
  if used + want <= total then
    local token = next_token(fence_key)
    local exp = now_ms() + lease_ms
    redis.call('hset', lock, field, grant_value(exp, want, token, owner), ':n', total_text)
    redis.call('pexpire', lock, sformat('%d', math.max(exp, latest) - now_ms()))
    return 1, token, 0
  end
  local retry = math.max(earliest - now_ms(), 1)
  if horizon ~= '0' then
    register_waiter(queue, tonumber(horizon))
    -- look again before the registration runs out (a second before it): a release after that
    -- would not publish, and the waiter would sleep through it until the earliest lease ends
    retry = math.min(retry, math.max(tonumber(horizon) - 1000, 1))
  end
  -- the third value: permits free now (a smaller request may fit)
  return 0, retry, math.max(total - used, 0)
end

-- Whether this service keeps a grant it releases for its next waiter while other services
-- wait: only while it holds fewer than its share of the permits (all of them split evenly
-- among the services registered as waiting, this one included; at least one), so that a busy
-- service does not keep them all. `held`: the other grants it holds.
local function may_keep(queue, held, total)
  if held == 0 then
    return true
  end
  local now = now_ms()
  local others = redis.call('zcount', queue, sformat('(%d', now), '+inf')
  if others == 0 then
    return true
  end
  local mine = tonumber(redis.call('zscore', queue, service))
  if mine and mine > now then
    others = others - 1
  end
  return others == 0 or held < math.max(math.floor(total / (others + 1)), 1)
end

-- release: hash, fence counter, services waiting, unused; owner field; grant id; the next
-- waiter of this service ('' for none): its owner field, its grant id, and '<lease in ms>
-- <grants this service holds besides> <its extra>'. The next waiter gets the grant it asks
-- for in this call when it fits in the permits and this service may keep them (may_keep);
-- else the permits are freed, and permits left free publish a wake-up when services wait.
-- Replies as ops.lua documents: 3, token, 0 when handed to the next waiter. With no next
-- waiter, the hash goes with its last grant; while others remain, its expiry stays the latest
-- lease an acquire set, which covers theirs (grants whose lease ran out are dropped by the
-- next acquire, and read as free meanwhile), so such a release reads nothing but the hash's
-- length.
local function release(lock, fence_key, queue, _, _, grant_id, next_owner, next_id, next_terms)
  local lease, held, want, total, total_text
  if next_owner ~= '' then
    lease, held, want, total_text = string.match(next_terms, '^(%d+) (%d+) (%d+) (%d+)$')
    lease, held, want, total = checked_lease(lease), tonumber(held), tonumber(want),
      tonumber(total_text)
    if not want or want < 1 or not total or want > total then
      error('invalid permit counts ' .. tostring(next_terms))
    end
  end
  if redis.call('hdel', lock, 'p:' .. grant_id) == 0 then
    return 0, 0, 0
  end
  if next_owner ~= '' then
    local field = 'p:' .. next_id
    local used, _, latest, made = sem_state(lock, field)
    -- (a grant the next waiter already has - made by an attempt whose reply was lost - is
    -- its own: its next attempt finds it)
    if used + want <= total and not made and may_keep(queue, held, total) then
      local token = next_token(fence_key)
      local exp = now_ms() + lease
      redis.call('hset', lock, field, grant_value(exp, want, token, next_owner), ':n',
        total_text)
      redis.call('pexpire', lock, sformat('%d', math.max(exp, latest) - now_ms()))
      if used + want < total and redis.call('exists', queue) == 1 then
        redis.call($PUBLISH, lock .. $CHANNEL_SUFFIX, '0')
      end
      return 3, token, 0
    end
  end
  -- ':n' and no grant left
  if redis.call('hlen', lock) <= 1 then
    redis.call('del', lock)
  end
  if redis.call('exists', queue) == 1 then
    redis.call($PUBLISH, lock .. $CHANNEL_SUFFIX, '0')
  end
  return 2, 0, 0
end
