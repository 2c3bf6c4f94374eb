-- The mutex's most common operations, run before the general ones (acquire.lua, release.lua):
-- a fresh acquire of a free lock, a release of the one grant of a lock no other service waits
-- for, and a release that hands the lock to the releasing service's next waiter (when no other
-- service waits, or in the service's turn). `fast_op` does exactly what acquire.lua and
-- release.lua do in those cases, with fewer calls and conversions (no owner fields cut out and
-- put together again: a value's tail is the argument 'grant|owner' as sent); a lone operation
-- runs it first in its call, and ops.lua's loop runs it first for each operation of a batched
-- call. Anything else goes on to the general functions, reusing what was done here: a fresh
-- acquire that finds the lock taken goes on as a plain one ('a'), having drawn its token
-- (tokens only need to increase) and read the clock (`time`); a release goes on with the value
-- read (`read_first`). What comes before the `--@call` line declares; what follows runs on
-- every call (in the Redis Function form of the script, scripts/mod.rs, the declarations run
-- once).

-- The lock's value as the release below read it (false: no such key), for release.lua, which
-- takes it instead of reading again; nil when nothing was read.
local read_first = nil

-- The operation whose op code is argv[a] and whose keys start at keys[k] (KEYS and ARGV as in
-- ops.lua), when it is one of the two above: its three reply values, the token as decimal text
-- (converting it to a number costs Redis a string-to-float parse). Else nil, after changing
-- what the general functions should take from here (above).
local function fast_op(keys, k, argv, a)
  local op = argv[a]
  if op == 'f' then
    if argv[a + 3] == '-1' then
      return nil
    end
    -- checked before anything is written; the SET takes the text as sent (a number passed to
    -- a redis.call would be formatted as a float)
    local lease = argv[a + 2]
    checked_lease(lease)
    local token = next_token($FENCE_K)
    -- the value's tail is the argument 'grant|owner' as sent
    if rcall('set', keys[k], 'H' .. stored_token(token) .. argv[a + 1], 'nx', 'px', lease) then
      return 1, token, 0
    end
    argv[a] = 'a'
  elseif op == 'x' or op == 'r' or op == 'k' then
    -- the next owner's 'grant|owner' ('' for none) and its lease (for none: how long the lock
    -- stays taken, '0' or '')
    local next_tail, lease = '', '0'
    if op ~= 'x' then
      next_tail, lease = argv[a + 2], argv[a + 3]
      if next_tail == '' and lease ~= '0' and lease ~= '' then
        -- kept for a minimum hold
        return nil
      end
      if next_tail ~= '' then
        checked_lease(lease)
      end
    end
    -- held ('H', byte 72; 'W', 87: services registered as waiting) under this grant: the
    -- value's tail from its 18th byte is the argument (compared in place: cutting the tail out
    -- would make Redis hash a new string)
    local v, tail = rcall('get', keys[k]), argv[a + 1]
    if v and #v == 17 + #tail and sfind(v, tail, 18, true) then
      local state = sbyte(v)
      if state == 72 and next_tail == '' then
        rcall('del', keys[k])
        return 2, 0, 0
      end
      if next_tail ~= '' and (state == 72 or (state == 87 and op == 'k')) then
        -- to the next waiter of this service: nobody else waits, or it is this service's turn
        local token = next_token($FENCE_K)
        local value = (state == 72 and 'H' or 'W') .. stored_token(token) .. next_tail
        rcall('set', keys[k], value, 'px', lease)
        return 3, token, 0
      end
    end
    read_first = v
  end
  return nil
end
--@call
read_first = nil

if #KEYS == $KEYS then
  local code, x, y = fast_op(KEYS, 1, ARGV, 3)
  -- (code 1 or 3 with a token's text, or 2, 0, 0: as reply_of in reply.lua makes it, without
  -- writing a number as text)
  if code == 2 then
    return '2 0 0'
  elseif code then
    return reply_digits[code] .. ' ' .. x .. ' 0'
  end
end
