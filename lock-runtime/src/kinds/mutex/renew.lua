-- The mutex kind: watchdog renewal of many locks at once, or a new lease for one (extend);
-- never re-creates a vanished lock, never renews another generation of the same owner.
-- KEYS[i] lock hash i; ARGV[1] lease in ms; ARGV[2] 'r': renew (never shorten the expiry) or
-- 'x': set it to exactly the lease; ARGV[2i + 1] owner field of lock i, ARGV[2i + 2] the grant
-- id of its hold
-- Reply: array, element i = 1 when lock i is still held under that grant (renewed), 0 when
-- not, -1 when renewing it failed (say, the key is not a lock hash), 2 for an 'x' on a grant
-- that other processes share (an owner the same in every process, several grant ids in its
-- field): the expiry was lengthened to the lease if that is longer, never shortened, as the
-- other processes count on it; one lock failing does not stop the others
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease ~= math.floor(lease) then
  error('invalid lease ' .. tostring(ARGV[1]) .. ' ms')
end
local exact = ARGV[2] == 'x'
local renewed = {}
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
for i, lock in ipairs(KEYS) do
  local ok, flag = pcall(renew, lock, ARGV[2 * i + 1], ARGV[2 * i + 2])
  renewed[i] = ok and flag or -1
end
return renewed
