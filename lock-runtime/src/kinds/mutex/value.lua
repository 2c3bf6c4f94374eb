-- The mutex kind's data: one string `<prefix>{<key>}` per lock, whose expiry is the lease,
--   state .. token .. grant ids .. '|' .. owner field
-- - state, one character: 'H' held, and no service has registered as waiting since the grant
--   (nor was one seen at the grant, except by a fresh attempt, which does not look: a service
--   whose registration outlived a lease finds the lock held when it looks again and marks it
--   'W'); its release just deletes the key; 'W' held, and services are
--   registered as waiting (its release looks for the next turn); 'T' nobody holds it: the next turn is reserved for
--   the service named in place of the owner field, for the length of a turn (token zero, no
--   grant ids), or, when that field is 'done:' .. the last owner's field, the lock is kept after
--   its release for a minimum hold (the token is the finished grant's; nobody's turn: it
--   expires);
-- - token, the fencing token of the grant: 16 decimal digits, zero-padded (tokens < 2^53);
-- - grant ids, 16 hex digits each, separated by spaces: one per process holding it (several
--   only for an owner that is the same in every process, 'mesh:' fields);
-- - owner field: any text (the first '|' after the grant ids ends them).
-- The lock's waiting services `<lock>:wq`, their heads `<lock>:wh` and its channel `<lock>:ch`
-- are written only when a service waits: an uncontended acquire and release write the lock key and the fence counter of
-- its slot, nothing else (a fresh acquire takes a free lock with `SET NX` at once; any other
-- acquire asks whether `<lock>:wq` exists and removes its service from it).

-- The state, token text, grant ids and owner field of a mutex's value; fails (before anything
-- is written) on a string this library did not write.
local function parts(v)
  local bar = string.find(v, '|', 18, true)
  if not bar or not string.find('HWT', string.sub(v, 1, 1), 1, true) then
    error('the lock key holds a string that is not a lock: ' .. string.sub(v, 1, 40))
  end
  return string.sub(v, 1, 1), string.sub(v, 2, 17), string.sub(v, 18, bar - 1),
    string.sub(v, bar + 1)
end

-- A mutex's value: state, token (decimal text without padding), grant ids, owner field.
local function held(state, token, ids, owner)
  return state .. stored_token(token) .. ids .. '|' .. owner
end

-- A registered service's head waiter, in the hash `<lock>:wh` (field: the service id), so that
-- a release of another service can grant the lock to it at once instead of giving its service
-- a turn to claim (see release.lua):
--   grant id .. ' ' .. lease in ms .. ' ' .. sent .. ' ' .. registered .. ' ' .. owner field
-- where `sent` is when the client sent the registering call (its own clock, see ops.lua) and
-- `registered` the server clock in microseconds when it ran: the grant's message tells the
-- service how long after its send time the grant was made (`sent` plus the server time that
-- passed since), the earliest its lease can have started. A service that sends no `sent`
-- (replicas must acknowledge its grants before it uses them) notes no head: it gets turns.
-- A service's note stays after its registration is removed, to be overwritten by its next
-- one; the hash is deleted with the last registration, and it lives at least as long as the
-- registrations: it gets the registrations' expiry when they were just made (`registered`,
-- register_waiter's reply, is 'new': any note left is of a registration that is gone), and its
-- expiry is looked at when a service's note is new or the registrations' expiry was
-- lengthened. Call after register_waiter.
local function note_head(heads, grant_id, lease_ms, owner, horizon_ms, registered)
  if sent == '' then
    return
  end
  local new = redis.call('hset', heads, service, grant_id .. ' ' .. lease_ms .. ' ' .. sent ..
    ' ' .. clock_us() .. ' ' .. owner) == 1
  local expiry = horizon_ms + math.floor(horizon_ms / 4)
  if registered == 'new' then
    redis.call('pexpire', heads, expiry)
  elseif (new or registered) and redis.call('pttl', heads) < horizon_ms then
    redis.call('pexpire', heads, expiry)
  end
end
