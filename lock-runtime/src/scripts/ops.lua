-- Runs lock operations in order, each as if it were a script call of its own: the acquires and
-- releases of one service that fall due while another call is on its way share one call.
-- KEYS: one per operation: the lock hash (its other keys are named after it, see prelude.lua)
-- ARGV[1] service id; then four per operation:
--   'a', owner field, lease in ms, waiter horizon in ms       (acquire.lua)
--   'r', owner field, next owner field or '', its lease in ms (release.lua)
-- Reply: three elements per operation, in order: the values its function returned, or -1,
-- error message, 0 when it failed (a failed operation does not stop the others). One flat
-- array: a table per operation would cost Redis more than the operation.
if #KEYS == 1 then
  -- a lone caller's operation, the common case when there is no load: a failure fails the call,
  -- which is its failure alone, so it goes without the loop and pcall (7% of its cost)
  if ARGV[2] == 'a' then
    return {acquire(KEYS[1], ARGV[3], ARGV[4], ARGV[5])}
  end
  return {release(KEYS[1], ARGV[3], ARGV[4], ARGV[5])}
end
local replies = {}
for i = 1, #KEYS do
  local a, n = i * 4 - 3, i * 3
  local ok, code, x, y
  if ARGV[a + 1] == 'a' then
    ok, code, x, y = pcall(acquire, KEYS[i], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
  else
    ok, code, x, y = pcall(release, KEYS[i], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
  end
  if not ok then
    -- a failed redis.call raises its error as a string (a table with `err` before Redis 7)
    code, x, y = -1, type(code) == 'table' and code.err or tostring(code), 0
  end
  replies[n - 2], replies[n - 1], replies[n] = code, x, y
end
return replies
