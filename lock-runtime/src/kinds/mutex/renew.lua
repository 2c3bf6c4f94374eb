-- The mutex's renewal (see scripts/renew.lua for the call): a hold is the owner field's grant
-- ids; never renews another generation of the same owner. Reply code 2: an 'x' on a grant that
-- other processes share (an owner the same in every process, several grant ids in its field):
-- the expiry was lengthened to the lease if that is longer, never shortened, as the other
-- processes count on it.
local function renew(lock, owner, grant_id)
  local held = redis.call('hget', lock, owner)
  if held and string.find(held, grant_id, 1, true) then
    local shared = #held > #grant_id
    if (exact and not shared) or redis.call('pttl', lock) < lease then
      redis.call('pexpire', lock, lease)
    end
    if exact and shared then
      return 2
    end
    return 1
  end
  return 0
end
