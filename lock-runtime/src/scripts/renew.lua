-- Renews many holds of one kind at once (the watchdog), or sets a new lease for one (extend);
-- never re-creates a vanished hold. Built by scripts/mod.rs as clock.lua, this head, the
-- kind's `renew(lock, owner, grant_id)` function (kinds/<kind>/renew.lua), then renew_run.lua.
-- KEYS[i] hash of hold i; ARGV[1] lease in ms; ARGV[2] 'r': renew (never shorten the expiry)
-- or 'x': set it to exactly the lease; ARGV[2i + 1] owner field of hold i, ARGV[2i + 2] the
-- grant id of hold i.
-- Reply: array, element i = what `renew` returned for hold i (1 renewed; 0 not held under that
-- grant: never renewed then; a kind may add codes, see its renew.lua), or -1 when renewing it
-- failed (say, the key is not a hash of this kind); one hold failing does not stop the others.
local lease = checked_lease(ARGV[1])
local exact = ARGV[2] == 'x'
