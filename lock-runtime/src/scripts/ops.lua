-- Runs lock operations of one kind in order, each as if it were a script call of its own: the
-- acquires and releases of one service that fall due while another call is on its way share one
-- call. The kind's `acquire` and `release` functions come before this (see engine/kind.rs), and
-- its `fast_op` for its common cases when it has one ($FAST_OP; nil when it has none).
-- KEYS: $KEYS per operation. In Redis Cluster: the lock, the fence counter of its slot, its
-- waiting-services zset and, for a kind that uses one, a fourth key of its own (a read-write
-- lock's turn marker, a mutex's waiting heads) - all in the lock's slot, and declared so that a
-- call stays correct while that slot migrates. On one server: the lock only; the script names
-- the others after the lock key ($QUEUE_K, $FOURTH_K), and every lock draws its tokens from the
-- server's one counter ($FENCE_K): three arguments fewer per operation. Either way the
-- operations of one call share one counter (a cluster call is of one slot), so the call reads
-- it once and writes it once (see next_token).
-- ARGV[1] service id; ARGV[2] when the client sent the call, in microseconds of its own clock (a
-- mutex waiter registered by the call may be granted the lock by another service's release,
-- which tells it how long after this send time that happened: see kinds/mutex/value.lua), or ''
-- when its waiters must not be granted that way; then $ARGS per operation, 2 for 'x' (an owner
-- and the grant id go as one argument, '<grant id>|<owner field>', the tail of the value a
-- mutex grant stores; a grant id is hex, so the first '|' ends it):
--   'a', grant|owner, lease in ms, waiter horizon in ms[, kind's extra]  (acquire; the extra
--        only for a kind that has one, engine/kind.rs)
--   'A': like 'a', but the run stops at this operation when it is not granted (or fails): the
--        operations after it are not run and reply -2, 'not run', 0 (all-or-nothing batches)
--   'f': like 'a', from a service that is not registered as waiting for the lock: the kind's
--        acquire may try the lock before it looks at anything else (its `fresh` parameter)
--   'r', grant|owner, the next owner's grant|owner or '', its lease[, '']  (release; for a
--        kind whose grants coexist, '<its lease> <grants the service holds besides> <its
--        extra>': the release sees whether its request fits)
--   'k': like 'r', in the releasing service's turn: a kind that hands off gives the lock to the
--        next owner even when other services wait (the release function's `in_turn`)
--   'x', grant|owner: a plain release, two arguments only: like 'r' with no next owner and a
--        lease of 0 (free the lock now), the common release
-- Every kind's acquire replies 1, token, 0 (granted) | 2, token, n (the owner holds it under
-- this grant id) | 0, ms, room (not now; look again in about ms; room > 0: another request
-- might be granted now, so the waiter behind may try: permits left free, a reader kept out
-- only by writers waiting); its release replies 0, 0, 0 (not held under this grant id) | 1, n,
-- 0 (still held by other grants of the owner) | 2, yielded, 0 (freed; 1: the next turn went to
-- another service) | 3, token, 0 (handed to the next owner). A token is an integer or its
-- decimal text.
-- Reply: three values per operation, in order: the values its function returned, or -1,
-- error message, 0 when it failed (a failed operation does not stop the others, and fails
-- before it writes anything). When every operation ran, one string of the values as decimal
-- texts separated by spaces (see reply.lua); else one flat array of them: a table per
-- operation would cost Redis more than the operation. What comes before the `--@call` line
-- declares; what follows runs on every call (see fast.lua).

-- 'grant|owner' as grant id, owner field ('' as '', '').
local function split_tail(tail)
  local bar = string.find(tail, '|', 1, true)
  if not bar then
    return '', ''
  end
  return string.sub(tail, 1, bar - 1), string.sub(tail, bar + 1)
end

-- The operation whose keys start at keys[k] and whose arguments at argv[a], by the kind's
-- general functions.
local function run_op(keys, argv, k, a)
  local op = argv[a]
  local grant, owner = split_tail(argv[a + 1])
  if op == 'x' then
    return release(keys[k], $FENCE_K, $QUEUE_K, $FOURTH_K, owner, grant, '', '', '0', false)
  end
  if op ~= 'r' and op ~= 'k' then
    return acquire(keys[k], $FENCE_K, $QUEUE_K, $FOURTH_K, owner, grant, argv[a + 2],
      argv[a + 3], $EXTRA_A, op == 'f')
  end
  local next_id, next_owner = split_tail(argv[a + 2])
  return release(keys[k], $FENCE_K, $QUEUE_K, $FOURTH_K, owner, grant, next_owner, next_id,
    argv[a + 3], op == 'k')
end
--@call
service, sent = ARGV[1], ARGV[2]
if #KEYS == $KEYS then
  -- a lone caller's operation, the common case when there is no load: a failure fails the call,
  -- which is its failure alone, so it goes without the loop and pcall
  return reply_of(run_op(KEYS, ARGV, 1, 3))
end
local replies = {}
-- the counter is written once, after the loop
deferring = true
local stopped, failed = false, false
local a = 3
for i = 1, #KEYS / $KEYS do
  local k, n = i * $KEYS - ($KEYS - 1), i * 3
  local ok, code, x, y = true, nil, nil, nil
  if stopped then
    code, x, y = -2, 'not run', 0
  elseif $FAST_OP then
    -- the kind's common cases first (nil: not one of them)
    ok, code, x, y = pcall($FAST_OP, KEYS, k, ARGV, a)
  end
  if ok and code == nil then
    ok, code, x, y = pcall(run_op, KEYS, ARGV, k, a)
  end
  if not ok then
    -- a failed redis.call raises its error as a string (a table with `err` before Redis 7)
    code, x, y = -1, type(code) == 'table' and code.err or tostring(code), 0
  end
  local op = ARGV[a]
  if op == 'A' and code ~= 1 and code ~= 2 then
    stopped = true
  end
  -- the next operation's arguments
  if op == 'x' then
    a = a + 2
  else
    a = a + $ARGS
  end
  -- as text for the reply of one string (reply.lua), unless the call replies an array
  -- (the common values without a function call: a small code, a token's text, a small y)
  local tc = reply_digits[code] or reply_text(code)
  local tx = reply_digits[x] or type(x) == 'string' and x or reply_text(x)
  local ty = reply_digits[y] or reply_text(y)
  if code == -1 or code == -2 or not (tc and tx and ty) then
    failed = true
    replies[n - 2], replies[n - 1], replies[n] = code, x, y
  else
    replies[n - 2], replies[n - 1], replies[n] = tc, tx, ty
  end
end
write_drawn()
if failed then
  return replies
end
return table.concat(replies, ' ')
