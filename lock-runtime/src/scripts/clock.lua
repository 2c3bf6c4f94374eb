-- The server clock, the lease check and the fencing tokens the scripts that set a lease share:
-- the lock operations (ops.lua, after prelude.lua) and the kinds' renewals (renew.lua).
-- scripts/mod.rs puts this first and replaces $MAX_LEASE with its literal; in the Function form
-- (one definition for every call) it resets `time`, `clock_ms`, `clock_us_text`, `drawn_key`,
-- `deferring` and `dirty` per call, and sets `rcall` and the other locals of the first lines.

-- What the operations call most, as locals: a global costs a table lookup per use (`redis.call`
-- and `string.format` two). A Function library reaches no global while it loads: scripts/mod.rs
-- sets these after this part in the script form, per call in the Function form.
local rcall, sformat, sbyte, sfind = nil, nil, nil, nil

-- The server clock (TIME's reply: seconds, microseconds), read once per run: grants of one run
-- may share a reading, the counter keeps their tokens apart.
local time = nil
-- That reading in ms, once a call asked for it (converting it costs two string-to-number
-- parses).
local clock_ms = nil
-- That reading in microseconds as decimal text, once a call asked for it (`clock_us`).
local clock_us_text = nil
-- The fence counter this call drew its last token from, and that token (decimal text, and as a
-- number once one was needed: a lone grant needs none).
local drawn_key, drawn_token, drawn_number = nil, nil, nil
-- Whether a token drawn from `drawn_key` after the first may wait to be written until the
-- call's operations have run (`deferring`, set by ops.lua's loop, which writes it at its end:
-- one write per call and counter instead of one per token; a script runs alone, so nothing
-- reads the counter in between), and whether one waits (`dirty`).
local deferring, dirty = false, false

-- The server clock in microseconds as decimal text, read and written once per call (every
-- fresh token of a call starts from it).
local function clock_us()
  if not clock_us_text then
    if not time then
      time = redis.call('time')
    end
    clock_us_text = time[1] .. string.sub('00000' .. time[2], -6)
  end
  return clock_us_text
end

local function now_ms()
  if not clock_ms then
    if not time then
      time = redis.call('time')
    end
    clock_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  return clock_ms
end

-- The last lease text `checked_lease` accepted, and its value: the acquires of a call mostly
-- ask for the same lease, and converting its text costs a string-to-float parse.
local accepted_text, accepted_ms = nil, nil

-- A lease in ms as sent by the client, checked before anything is written (Lua does not roll
-- back a script that fails half-way).
local function checked_lease(lease)
  if lease == accepted_text then
    return accepted_ms
  end
  local ms = tonumber(lease)
  if not ms or ms < 1 or ms > $MAX_LEASE or ms ~= math.floor(ms) then
    error('invalid lease ' .. tostring(lease) .. ' ms (1 to ' .. $MAX_LEASE .. ')')
  end
  accepted_text, accepted_ms = lease, ms
  return ms
end


-- Writes the last token drawn to its counter if that write was deferred.
local function write_drawn()
  if dirty then
    rcall('set', drawn_key, drawn_token)
    dirty = false
  end
end

-- The last token issued from the counter `fence_key` (decimal text), or nil when there is none.
local function last_token(fence_key)
  if fence_key == drawn_key then
    return drawn_token
  end
  return redis.call('get', fence_key)
end

-- A token's text as a lock's value stores it: 16 decimal digits, zero-padded (tokens < 2^53).
local function stored_token(token)
  if #token < 16 then
    return string.rep('0', 16 - #token) .. token
  end
  return token
end

-- The next fencing token of the lock whose counter is `fence_key`, as decimal text, stored as
-- the last token issued (see prelude.lua for the counters). In the common case the clock is
-- ahead of the last token, and one SET ... GET reads the last token and writes the new one; only
-- a counter ahead of the clock is written a second time. A call whose last draw was from this
-- counter (operations sharing a call share a counter: one server's, or one slot's in a
-- cluster, and a clock reading too) goes on from it with no read: one SET, or none while
-- `deferring` (then `write_drawn` writes the last token once). Tokens are compared as decimal
-- text without sign or leading zeros (the longer is larger; digits collate in order in every
-- locale), which costs less than converting them to numbers (a string-to-float parse); they
-- stay below 2^53, exact as Lua numbers and written with '%d' (no float formatting).
local function next_token(fence_key)
  local token
  local number = nil
  if fence_key == drawn_key then
    number = (drawn_number or tonumber(drawn_token)) + 1
    token = sformat('%d', number)
    if deferring then
      dirty = true
    else
      rcall('set', fence_key, token)
    end
  else
    write_drawn()
    token = clock_us()
    local last = rcall('set', fence_key, token, 'get')
    if last and (#last > #token or (#last == #token and last >= token)) then
      number = tonumber(last) + 1
      token = sformat('%d', number)
      rcall('set', fence_key, token)
    end
  end
  drawn_key, drawn_token, drawn_number = fence_key, token, number
  return token
end
