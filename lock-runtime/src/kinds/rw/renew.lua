-- The read-write lock's renewal (see scripts/renew.lua for the call): hold i is the write hold
-- when the hash has 'w:<owner>' with that grant id, else the read hold 'r:<grant id>'; each
-- keeps its own expiry (server ms) as data, and the key expires with the latest of them.
local function latest_of(lock)
  local latest = 0
  local all = redis.call('hgetall', lock)
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    local exp = nil
    if string.sub(f, 1, 2) == 'r:' then
      exp = tonumber(string.match(v, '^%d+'))
    elseif f == ':wexp' then
      exp = tonumber(v)
    end
    if exp and exp > latest then
      latest = exp
    end
  end
  return latest
end
local function renew(lock, owner, grant_id)
  local now = now_ms()
  local exp = now + lease
  if redis.call('hget', lock, 'w:' .. owner) == grant_id then
    local old = tonumber(redis.call('hget', lock, ':wexp')) or 0
    if old <= now then
      return 0
    end
    if exact or exp > old then
      redis.call('hset', lock, ':wexp', exp)
    end
  else
    local field = 'r:' .. grant_id
    local v = redis.call('hget', lock, field)
    local old = v and tonumber(string.match(v, '^%d+')) or 0
    if old <= now then
      return 0
    end
    if exact or exp > old then
      redis.call('hset', lock, field, exp .. ' ' .. string.match(v, '^%d+ (.*)$'))
    end
  end
  redis.call('pexpire', lock, math.max(latest_of(lock) - now, 1))
  return 1
end
