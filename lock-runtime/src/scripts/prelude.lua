-- Settings and shared helpers of the lock operations (ops.lua). scripts/mod.rs puts a line
-- before this one that defines constants shared with the Rust side: the suffixes that name a
-- lock's other keys and its wake-up channel after the lock key (`fence_suffix`, `queue_suffix`,
-- `turn_suffix`, `channel_suffix`) and `turn_ms`, how long a turn given to another service
-- lasts. The other keys share the lock key's hash tag, so they live in its cluster slot: only
-- the lock key is passed in KEYS (every key passed costs the call as much as a Redis command).
--
-- A lock is a hash: one field per owner holding its hold count, plus the field ':fence' holding
-- the fencing token of the current grant. Owner fields never start with ':'.
--
-- Fencing tokens: the next token is max(last token + 1, server clock in microseconds). The
-- counter alone makes tokens strictly increase; the clock keeps them increasing when the counter
-- is lost (a failover that drops the last writes, a flush), as long as the clock does not jump
-- back. Tokens stay below 2^53 and are handled as decimal text: converting numbers to and from
-- text costs more than the rest of a grant, and Lua would print large ones in exponent notation.

-- The run's settings (ARGV[1] to ARGV[4], see ops.lua), kept as text: redis.call takes them so.
local service, publish, fence_ttl, yield_horizon = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

-- The server clock, read once per run: grants of one run may share a reading, the counter keeps
-- their tokens apart.
local time = nil
local function clock()
  if not time then
    time = redis.call('time')
  end
  return time
end

-- The clock in microseconds, as decimal text.
local function now_text()
  local t = clock()
  return t[1] .. string.sub('00000' .. t[2], -6)
end

local function now_ms()
  local t = clock()
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether the decimal text a (no sign, no leading zeros) is at least b.
local function at_least(a, b)
  return #a > #b or (#a == #b and a >= b)
end

-- The common case (the clock is ahead of the last token) takes one SET ... GET; only a token
-- that would not increase is written a second time. The counter expires after fence_ttl ms
-- without a grant ('0': never); the clock then carries the tokens on.
local function set_fence(fence_key, text, get)
  if fence_ttl ~= '0' then
    if get then
      return redis.call('set', fence_key, text, 'px', fence_ttl, 'get')
    end
    return redis.call('set', fence_key, text, 'px', fence_ttl)
  end
  if get then
    return redis.call('set', fence_key, text, 'get')
  end
  return redis.call('set', fence_key, text)
end

-- Grants `lock` to `owner` for lease_ms (text); returns the fencing token as text.
local function grant(lock, owner, lease_ms)
  local fence_key = lock .. fence_suffix
  local text = now_text()
  local last = set_fence(fence_key, text, true)
  if last and at_least(last, text) then
    text = string.format('%.0f', tonumber(last) + 1)
    set_fence(fence_key, text, false)
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
