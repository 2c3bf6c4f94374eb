-- The read-write kind: watchdog renewal of many holds at once, or a new lease for one (extend);
-- never re-creates a vanished hold. Contract as mutex/renew.lua: KEYS[i] hash i; ARGV[1] lease
-- in ms; ARGV[2] 'r' (never shorten) or 'x' (exactly); ARGV[2i + 1] owner field, ARGV[2i + 2]
-- grant id of hold i (a write hold when the hash has 'w:<owner>' with that grant id, else the
-- read hold 'r:<grant id>'). Reply: 1 renewed, 0 not held, -1 failed, per hold.
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease ~= math.floor(lease) then
  error('invalid lease ' .. tostring(ARGV[1]) .. ' ms')
end
local exact = ARGV[2] == 'x'
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
local renewed = {}
for i, lock in ipairs(KEYS) do
  local ok, flag = pcall(renew, lock, ARGV[2 * i + 1], ARGV[2 * i + 2])
  renewed[i] = ok and flag or -1
end
return renewed
