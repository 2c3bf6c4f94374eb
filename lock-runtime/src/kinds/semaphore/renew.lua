-- The semaphore kind: watchdog renewal of many grants at once, or a new lease for one
-- (extend); never re-creates a vanished grant. Contract as mutex/renew.lua: KEYS[i] hash i;
-- ARGV[1] lease in ms; ARGV[2] 'r' (never shorten) or 'x' (exactly); ARGV[2i + 1] owner field,
-- ARGV[2i + 2] grant id of grant i. Reply: 1 renewed, 0 not held, -1 failed, per grant.
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease ~= math.floor(lease) then
  error('invalid lease ' .. tostring(ARGV[1]) .. ' ms')
end
local exact = ARGV[2] == 'x'
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function renew(lock, grant_id)
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
local renewed = {}
for i, lock in ipairs(KEYS) do
  local ok, flag = pcall(renew, lock, ARGV[2 * i + 2])
  renewed[i] = ok and flag or -1
end
return renewed
