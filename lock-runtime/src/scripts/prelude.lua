-- Settings and shared helpers of the lock operations (ops.lua). scripts/mod.rs replaces each
-- dollar-prefixed name below with a literal from the service's configuration (a literal costs a
-- call nothing; a local shared by the functions below would cost it an upvalue each):
-- - the suffixes that name a lock's other keys and its wake-up channel after the lock key
--   ($FENCE_SUFFIX, $QUEUE_SUFFIX, $TURN_SUFFIX, $CHANNEL_SUFFIX); the other keys share the
--   lock key's hash tag, so they live in its cluster slot, and only the lock key is passed in
--   KEYS (every argument costs a call about as much as a Redis command);
-- - $TURN_MS, how long a turn given to another service lasts; $PUBLISH, the command that
--   publishes a wake-up ('publish', or 'spublish' in cluster mode); $FENCE_TTL, the fence
--   counter's idle TTL in ms as text ('0': never expires); $YIELD_HORIZON, how long in ms a
--   service stays registered as waiting when its release yields the lock to another service.
--
-- A lock is a hash: one field per owner holding its hold count, plus the field ':fence' holding
-- the fencing token of the current grant (decimal text). Owner fields never start with ':'.
--
-- Fencing tokens: the counter counts up by one per grant; when there is none (the first grant,
-- after $FENCE_TTL without grants, or after a failover or flush lost it) it starts again from
-- the server clock in microseconds. So tokens strictly increase: the counter falls behind the
-- clock with time (one per grant against a million per second), so a counter started afresh
-- from the clock is ahead of every token the lost one gave, as long as the clock does not jump
-- back. Tokens stay below 2^53.

-- The calling service (ARGV[1], see ops.lua).
local service = ARGV[1]

-- The server clock in ms, read once per run.
local clock_ms = nil
local function now_ms()
  if not clock_ms then
    local t = redis.call('time')
    clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock_ms
end

-- Grants `lock` to `owner` for lease_ms (text); returns the fencing token as decimal text.
local function grant(lock, owner, lease_ms)
  local fence_key = lock .. $FENCE_SUFFIX
  local token = redis.call('incr', fence_key)
  local text
  if token == 1 then
    -- no counter: start from the clock
    local t = redis.call('time')
    text = t[1] .. string.sub('00000' .. t[2], -6)
    redis.call('set', fence_key, text)
  else
    text = string.format('%.0f', token)
  end
  if $FENCE_TTL ~= '0' then
    redis.call('pexpire', fence_key, $FENCE_TTL)
  end
  redis.call('hset', lock, owner, 1, ':fence', text)
  redis.call('pexpire', lock, lease_ms)
  return text
end

-- Registers this service as having waiters for the lock until now + horizon_ms (a number).
local function register_waiter(queue, horizon_ms)
  redis.call('zadd', queue, now_ms() + horizon_ms, service)
  if redis.call('pttl', queue) < horizon_ms then
    redis.call('pexpire', queue, horizon_ms)
  end
end
