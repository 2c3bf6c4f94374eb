-- The read-write kind: shared helpers of read.lua and write.lua.
--
-- A read-write lock is a hash: 'w:<owner>' -> the grant id of the write hold (at most one
-- owner), ':wexp' -> when the write hold expires (server ms), ':fence' -> the token of the
-- current write grant, and one field per read hold 'r:<grant id>' -> '<expiry ms> <token>
-- <owner>' (a read hold's token is its own, drawn from the counter: never a write grant's,
-- except a downgrade's, which is its own write's).
-- Leases are kept as data: each hold expires on its own, and the key's PEXPIRE is the latest of
-- them, so a crashed reader's share runs out with its lease while other readers stay. Keys:
-- the hash, its fence counter, the services waiting (readers and writers; a release publishes
-- when it is not empty) and the writers waiting (a zset of services: while a writer of any
-- service waits, new readers wait too, so writers never starve).

-- Reads the hash, dropping holds whose lease ran out. Returns the writer field (or nil), its
-- grant id, its expiry, the number of live readers and the latest expiry of any hold (0: none).
local function rw_state(lock)
  local now = now_ms()
  local all = redis.call('hgetall', lock)
  local writer, wgrant, wexp, readers, latest = nil, nil, 0, 0, 0
  local dead = {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    local tag = string.sub(f, 1, 2)
    if tag == 'r:' then
      local exp = tonumber(string.match(v, '^%d+')) or 0
      if exp <= now then
        dead[#dead + 1] = f
      else
        readers = readers + 1
        if exp > latest then
          latest = exp
        end
      end
    elseif tag == 'w:' then
      writer, wgrant = f, v
    elseif f == ':wexp' then
      wexp = tonumber(v) or 0
    end
  end
  if writer and wexp <= now then
    dead[#dead + 1] = writer
    dead[#dead + 1] = ':wexp'
    writer, wgrant = nil, nil
  end
  if #dead > 0 then
    redis.call('hdel', lock, unpack(dead))
  end
  if writer and wexp > latest then
    latest = wexp
  end
  return writer, wgrant, wexp, readers, latest
end

-- Sets the key's expiry to the latest hold's, or deletes it when no hold is left.
local function rw_expire(lock, latest)
  local left = latest - now_ms()
  if left > 0 then
    redis.call('pexpire', lock, left)
  else
    redis.call('del', lock)
  end
end

-- Whether a writer of any service is registered as waiting.
local function writers_waiting(writers)
  return redis.call('zcount', writers, now_ms(), '+inf') > 0
end

-- After a hold was released: publish when somebody waits and nothing is held any more.
local function rw_released(lock, queue, writer, readers, latest)
  if not writer and readers == 0 then
    redis.call('del', lock)
    if redis.call('exists', queue) == 1 then
      redis.call($PUBLISH, lock .. $CHANNEL_SUFFIX, '0')
    end
  else
    rw_expire(lock, latest)
  end
end
