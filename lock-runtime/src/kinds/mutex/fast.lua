-- The mutex's two most common operations, run first in its operations script (after the clock,
-- clock.lua), before the functions of the rest of it are defined (defining them costs every
-- call): a lone fresh acquire of a free lock, and a lone release of the one grant of a lock no
-- other service waits for. Each does exactly what acquire.lua and release.lua do in that case;
-- anything else goes on to them, reusing what was read here: a fresh acquire that finds the lock
-- taken goes on as a plain one ('a'), having drawn its token (tokens only need to increase) and
-- read the clock (`time`); a release goes on with the value read (`read_first`). KEYS and ARGV
-- as in ops.lua. What comes before the `--@call` line declares; what follows runs on every call
-- (in the Redis Function form of the script, scripts/mod.rs, the declarations run once).

-- The lock's value as the release below read it (false: no such key), for release.lua, which
-- takes it instead of reading again; nil when nothing was read.
local read_first = nil
--@call
read_first = nil

if #KEYS == 4 then
  local op = ARGV[3]
  if op == 'f' and ARGV[7] ~= '-1' then
    local lease = checked_lease(ARGV[6])
    -- the fencing token as prelude.lua's next_token draws it
    time = redis.call('time')
    local token = time[1] .. string.sub('00000' .. time[2], -6)
    local last = redis.call('set', KEYS[2], token, 'get')
    if last and (#last > #token or (#last == #token and last >= token)) then
      token = string.format('%d', tonumber(last) + 1)
      redis.call('set', KEYS[2], token)
    end
    local padded = token
    if #padded < 16 then
      padded = string.rep('0', 16 - #padded) .. padded
    end
    if redis.call('set', KEYS[1], 'H' .. padded .. ARGV[5] .. '|' .. ARGV[4], 'nx', 'px', lease)
    then
      return {1, tonumber(token), 0}
    end
    ARGV[3] = 'a'
  elseif (op == 'r' or op == 'k') and ARGV[6] == '' and (ARGV[8] == '0' or ARGV[8] == '') then
    local v = redis.call('get', KEYS[1])
    if v and string.sub(v, 1, 1) == 'H' and string.sub(v, 18) == ARGV[5] .. '|' .. ARGV[4] then
      redis.call('del', KEYS[1])
      return {2, 0, 0}
    end
    read_first = v
  end
end
