-- The semaphore's renewal (see scripts/renew.lua for the call): hold i is the grant
-- 'p:<grant id>' (the owner is not needed); each grant keeps its own expiry (server ms) as data,
-- and the key expires with the latest of them.
local function renew(lock, _, grant_id)
  local now = now_ms()
  local field = 'p:' .. grant_id
  local v = redis.call('hget', lock, field)
  if not v then
    return 0
  end
  local old, rest = string.match(v, '^(%d+) (.*)$')
  old = tonumber(old) or 0
  if old <= now then
    return 0
  end
  local exp = now + lease
  if exact or exp > old then
    redis.call('hset', lock, field, exp .. ' ' .. rest)
  end
  local latest = 0
  local all = redis.call('hgetall', lock)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'p:' then
      local e = tonumber(string.match(all[i + 1], '^%d+')) or 0
      if e > latest then
        latest = e
      end
    end
  end
  redis.call('pexpire', lock, math.max(latest - now, 1))
  return 1
end
