-- The mutex's renewal (see scripts/renew.lua for the call; the value's layout is in
-- value.lua): a hold is a grant id in the value under its owner field; never renews another
-- generation of the same owner, nor a reserved turn. Reply code 2: an 'x' on a grant that other
-- processes share (an owner the same in every process, several grant ids): the expiry was
-- lengthened to the lease if that is longer, never shortened, as the other processes count on
-- it.
local function renew(lock, owner, grant_id)
  local v = redis.call('get', lock)
  if not v then
    return 0
  end
  local state, _, ids, holder = parts(v)
  if holder ~= owner or state == 'T' or not string.find(ids, grant_id, 1, true) then
    return 0
  end
  local shared = ids ~= grant_id
  if (exact and not shared) or redis.call('pttl', lock) < lease then
    redis.call('pexpire', lock, lease)
  end
  if exact and shared then
    return 2
  end
  return 1
end
