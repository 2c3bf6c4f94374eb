-- Remove a lock whoever holds it, drop any pending turn, and wake its waiters.
-- KEYS[1] lock hash, KEYS[2] turn marker; ARGV[1] wake-up channel, ARGV[2] 'publish' or 'spublish'
-- Reply: 1 when a lock was removed, 0 when there was none
if redis.call('del', KEYS[1]) == 1 then
  redis.call('del', KEYS[2])
  redis.call(ARGV[2], ARGV[1], '0')
  return 1
end
return 0
