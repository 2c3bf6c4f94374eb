-- The mutex's two most common operations, run first in its operations script, before the
-- functions of the rest of it are defined (defining them costs every call): a lone fresh
-- acquire of a free lock, and a lone release of the one grant of a lock no other service waits
-- for. Each does exactly what acquire.lua and release.lua do in that case; anything else goes on
-- to them (a fresh acquire that finds the lock taken goes on as a plain one, 'a', having drawn
-- its token: tokens only need to increase). KEYS and ARGV as in ops.lua.
if #KEYS == 4 then
  local op = ARGV[3]
  if op == 'f' and ARGV[7] ~= '-1' then
    local lease = tonumber(ARGV[6])
    if lease and lease >= 1 and lease <= $MAX_LEASE and lease == math.floor(lease) then
      -- the fencing token as prelude.lua's next_token draws it
      local t = redis.call('time')
      local token = t[1] .. string.sub('00000' .. t[2], -6)
      local last = redis.call('set', KEYS[2], token, 'get')
      if last and (#last > #token or (#last == #token and last >= token)) then
        token = string.format('%.0f', tonumber(last) + 1)
        redis.call('set', KEYS[2], token)
      end
      local padded = token
      if #padded < 16 then
        padded = string.rep('0', 16 - #padded) .. padded
      end
      if redis.call('set', KEYS[1], 'H' .. padded .. ARGV[5] .. '|' .. ARGV[4], 'nx', 'px',
          lease) then
        return {1, tonumber(token), 0}
      end
      ARGV[3] = 'a'
    end
  elseif (op == 'r' or op == 'k') and ARGV[6] == '' and (ARGV[8] == '0' or ARGV[8] == '') then
    local v = redis.call('get', KEYS[1])
    if v and string.sub(v, 1, 1) == 'H' and string.sub(v, 18) == ARGV[5] .. '|' .. ARGV[4] then
      redis.call('del', KEYS[1])
      return {2, 0, 0}
    end
  end
end
