-- The server clock and the lease check every script that sets a lease shares: the lock
-- operations (ops.lua, after prelude.lua) and the kinds' renewals (renew.lua). scripts/mod.rs
-- puts this first and replaces $MAX_LEASE with its literal.

-- The server clock (TIME's reply: seconds, microseconds), read once per run: grants of one run
-- may share a reading, the counter keeps their tokens apart. (Read where it is needed rather
-- than through a helper: every function defined here is built again on every call.)
local time = nil

local function now_ms()
  if not time then
    time = redis.call('time')
  end
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- A lease in ms as sent by the client, checked before anything is written (Lua does not roll
-- back a script that fails half-way).
local function checked_lease(lease)
  local ms = tonumber(lease)
  if not ms or ms < 1 or ms > $MAX_LEASE or ms ~= math.floor(ms) then
    error('invalid lease ' .. tostring(lease) .. ' ms (1 to ' .. $MAX_LEASE .. ')')
  end
  return ms
end

