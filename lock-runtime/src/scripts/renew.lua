-- Watchdog renewal of many locks at once; never re-creates a vanished lock.
-- KEYS[i] lock hash i; ARGV[1] lease in ms; ARGV[i + 1] owner field of lock i
-- Reply: array, element i = 1 when lock i is still held by its owner (renewed), 0 when gone
local lease = tonumber(ARGV[1])
local renewed = {}
for i, lock in ipairs(KEYS) do
  if redis.call('hexists', lock, ARGV[i + 1]) == 1 then
    if redis.call('pttl', lock) < lease then
      redis.call('pexpire', lock, lease)
    end
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
