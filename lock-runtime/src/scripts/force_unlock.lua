-- Remove a lock whoever holds it and wake its waiters.
-- KEYS[1] lock hash; ARGV[1] wake-up channel, ARGV[2] 'publish' or 'spublish'
-- Reply: 1 when a lock was removed, 0 when there was none
if redis.call('del', KEYS[1]) == 1 then
  redis.call(ARGV[2], ARGV[1], '0')
  return 1
end
return 0
