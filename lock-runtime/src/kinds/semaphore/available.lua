-- The semaphore kind: how many permits are free (see semaphore.lua); changes nothing.
-- KEYS[1] the semaphore hash; ARGV[1] how many permits it has
-- Reply: the permits not held by a live grant (negative when more are held than it has now)
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local used = 0
local all = redis.call('hgetall', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'p:' then
    local exp, n = string.match(all[i + 1], '^(%d+) (%d+)')
    if tonumber(exp) and tonumber(exp) > now then
      used = used + tonumber(n)
    end
  end
end
return tonumber(ARGV[1]) - used
