-- Shared helpers, prepended to the scripts that grant locks (see scripts/mod.rs).
--
-- A lock is a hash: one field per owner holding its hold count, plus the field ':fence' holding
-- the fencing token of the current grant. Owner fields never start with ':'.
--
-- Fencing tokens: the next token is max(last token + 1, server clock in microseconds). The
-- counter alone makes tokens strictly increase; the clock keeps them increasing when the counter
-- is lost (a failover that drops the last writes, a flush), as long as the clock does not jump
-- back. Numbers are formatted with '%.0f' because Lua numbers are doubles and Redis would
-- otherwise store large ones in exponent notation; tokens stay below 2^53.
local function now_micros()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The common case (the clock is ahead of the last token) takes one SET ... GET; only a token
-- that would not increase is written a second time. The counter expires after fence_ttl_ms
-- without a grant (0: never); the clock then carries the tokens on.
local function set_fence(fence_key, text, fence_ttl_ms, get)
  if fence_ttl_ms > 0 then
    if get then
      return redis.call('set', fence_key, text, 'px', fence_ttl_ms, 'get')
    end
    return redis.call('set', fence_key, text, 'px', fence_ttl_ms)
  end
  if get then
    return redis.call('set', fence_key, text, 'get')
  end
  return redis.call('set', fence_key, text)
end

local function grant(lock, owner, lease_ms, fence_key, fence_ttl_ms)
  local token = now_micros()
  local text = string.format('%.0f', token)
  local last = tonumber(set_fence(fence_key, text, fence_ttl_ms, true) or '0')
  if last >= token then
    token = last + 1
    text = string.format('%.0f', token)
    set_fence(fence_key, text, fence_ttl_ms, false)
  end
  redis.call('hset', lock, owner, 1, ':fence', text)
  redis.call('pexpire', lock, lease_ms)
  return token
end

-- Registers `service` as having waiters for this lock until now + horizon_ms.
local function register_waiter(queue, service, horizon_ms)
  local until_ms = math.floor(now_micros() / 1000) + horizon_ms
  redis.call('zadd', queue, until_ms, service)
  if redis.call('pttl', queue) < horizon_ms then
    redis.call('pexpire', queue, horizon_ms)
  end
end

