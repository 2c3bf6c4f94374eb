-- Settings and shared helpers of the lock operations (ops.lua). scripts/mod.rs replaces each
-- dollar-prefixed name below with a literal from the service's configuration (a literal costs a
-- call nothing; a local shared by the functions below would cost it an upvalue each):
-- - $CHANNEL_SUFFIX, the suffix that names a lock's wake-up channel after the lock key (a
--   channel, not a key: in Redis Cluster the lock's keys are all passed in KEYS, so that a call
--   stays correct while its slot migrates);
-- - $TURN_MS, how long a turn given to another service lasts; $PUBLISH, the command that
--   publishes a wake-up ('publish', or 'spublish' in cluster mode); $YIELD_HORIZON, how long in ms a
--   service stays registered as waiting when its release yields the lock to another service;
--   $MAX_LEASE, the longest lease in ms a call may ask for; in ops.lua, $KEYS, the keys per
--   operation (in Redis Cluster 3, or 4 for a kind with a fourth key of its own; on one server
--   1), $FENCE_K, the fence counter, $QUEUE_K, the waiting-services zset, $FOURTH_K, the
--   fourth key (or nil),
--   $ARGS, the arguments per operation (4, or 5 for a kind with an extra argument), $EXTRA_A,
--   that argument (or ''), and $FAST_OP, the kind's function for its common cases (or nil).
--
-- Every grant carries the id of the attempt that made it (16 hex digits chosen by the client),
-- stored with the owner it was granted to (its generations: one per process holding it;
-- re-entry inside a process is counted by that process), so an operation whose reply was lost
-- can be undone exactly (release that id) and running one twice changes nothing the second
-- time. Each kind's file says how it stores its holds.
--
-- Fencing tokens: the next token is max(last token + 1, server clock in microseconds), where the
-- last token is read from a fence counter that never expires: in Redis Cluster the counter of
-- the lock's slot, `<prefix>fence:{<n>}` with `n` hashing to the slot (see `KeyNames`), shared
-- by every lock of that slot, so their number is bounded (16,384 at most) whatever the number
-- of lock keys; on one server the one counter every lock shares (slot 0's name). The counter
-- makes tokens strictly increase per lock, also when the server's clock steps back (an NTP
-- step, a restored snapshot, a failover to a node whose clock lags); the clock keeps them
-- increasing when the counter is lost (a failover that drops the last writes, a flush). Tokens
-- stay below 2^53.

-- The calling service and when it sent the call (ARGV[1] and ARGV[2]): set per call by ops.lua.
local service, sent

-- Registers this service as having waiters for the lock until now + horizon_ms (a number).
-- The next turn goes to the lowest score, so a registration only ever moves a service back
-- (GT): a service whose release just yielded, and so went to the back of the line, cannot move
-- ahead again by its next waiter's attempt. The set's expiry, when it must be lengthened, is
-- set a quarter beyond the horizon, so that the registrations that follow within that time
-- need not lengthen it again. Returns 'new' when the set had no expiry (it was just made),
-- 'lengthened' when its expiry was lengthened, else nil.
local function register_waiter(queue, horizon_ms, member)
  redis.call('zadd', queue, 'gt', sformat('%d', now_ms() + horizon_ms), member or service)
  local ttl = redis.call('pttl', queue)
  if ttl < horizon_ms then
    redis.call('pexpire', queue, sformat('%d', horizon_ms + math.floor(horizon_ms / 4)))
    if ttl < 0 then
      return 'new'
    end
    return 'lengthened'
  end
  return nil
end
