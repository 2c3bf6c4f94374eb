//! The fenced resource: a Redis hash that accepts a write only with a token greater than every
//! one it accepted before, the scripts that write to it, and the check of its log.
//!
//! The data the lock protects is a Redis hash `res:{<id>}` (field `fence`: the highest token
//! accepted so far) with a log list `res:{<id>}:log` beside it (one hash tag, so both share a
//! slot anywhere). Workers write through [`FENCED_WRITE`], a script that accepts a write only
//! when its token is greater than the stored one and appends `<token> <worker> <1|0>` to the
//! log either way; Redis runs scripts one at a time, so the log is the order in which the
//! resource saw the writes. [`ResourceCheck`] reads it back:
//!
//! * **stale writes accepted**: accepted writes whose token is not greater than an earlier
//!   accepted one. The script makes this impossible by construction; it is counted so that a
//!   broken script (or a resource that lost its state) shows up rather than passes silently.
//! * **stale writes rejected**: writes the script refused. These are the interesting figure: a
//!   holder that woke up from a pause longer than its lease and wrote with its old token, after
//!   a newer holder had written. With leases kept, every write of a mutex or a writer carries a
//!   greater token than the one before it (tokens increase with every grant, and no two
//!   holders overlap), so any rejection there means tokens were issued out of order. Permit
//!   holders of a semaphore of n > 1 overlap by design, so their writes are refused whenever a
//!   newer permit wrote first (see [`History::unexplained_rejections`]).
//!
//! A writer of a read-write lock writes in two parts, to show a reader that was not excluded:
//! [`FENCED_WRITE`] (the `fence` field, and the log), then [`FENCED_WRITE_END`], which sets the
//! field `done` to the token only when `fence` still holds it (the same hold; a newer writer's
//! write is never half overwritten). Readers read both fields with one `HMGET` (at one
//! moment); between writes they are equal. Read shares make no write.
//!
//! The resource lives on a `redis-server` of its own that the injected faults never touch (the
//! tests use the test binary's shared single server), not on the lock topology. A resource is
//! something else than the lock service - a database, a file store - and the fence check is
//! only as good as the resource's memory: on a lock server that is failed over or restarted
//! without persistence, the stored token would vanish with the lock data and the check would
//! accept anything afterwards, which says nothing about the lock. On a stalled lock server the
//! writes would stall too and stretch the sections with a fault the lock never sees.

#[cfg(doc)]
use super::History;

/// The token-checking write: `KEYS[1]` the resource hash, `KEYS[2]` its log list, `ARGV[1]`
/// the fencing token (decimal), `ARGV[2]` the writer's name. Accepts (sets `fence` and
/// `writer`, returns 1) only when the token is greater than the stored `fence`, else returns
/// 0; appends `<token> <writer> <1|0>` to the log either way.
///
/// Tokens are compared as decimal strings (longer is greater, equal lengths compare
/// bytewise), which is exact for every `u64`; Lua numbers are doubles and would not be.
pub const FENCED_WRITE: &str = r"
local token = ARGV[1]
if not string.match(token, '^[1-9]%d*$') then
  return redis.error_reply('fenced write: token must be a positive decimal, got ' .. token)
end
local stored = redis.call('HGET', KEYS[1], 'fence') or '0'
local newer = #token > #stored or (#token == #stored and token > stored)
if newer then
  redis.call('HSET', KEYS[1], 'fence', token, 'writer', ARGV[2])
end
redis.call('RPUSH', KEYS[2], token .. ' ' .. ARGV[2] .. ' ' .. (newer and '1' or '0'))
if newer then return 1 end
return 0
";

/// The second part of a writer's write (see the module docs): `KEYS[1]` the resource hash,
/// `ARGV[1]` the token. Sets `done` to the token and returns 1 when `fence` is that token (the
/// first part of this hold's write is the last one accepted), else returns 0 and writes
/// nothing.
pub const FENCED_WRITE_END: &str = r"
if redis.call('HGET', KEYS[1], 'fence') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'done', ARGV[1])
  return 1
end
return 0
";

/// The key of the log list of the resource `resource` (`res:{id}` → `res:{id}:log`).
pub fn resource_log_key(resource: &str) -> String {
    format!("{resource}:log")
}

/// One write in the resource's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The token it carried.
    pub fence: u64,
    /// The writer's name.
    pub worker: String,
    /// Whether the script accepted it.
    pub accepted: bool,
}

impl LogEntry {
    /// Parses `<token> <worker> <1|0>`.
    pub fn parse(line: &str) -> Option<LogEntry> {
        let mut words = line.split(' ');
        let fence = words.next()?.parse().ok()?;
        let worker = words.next()?.to_owned();
        let accepted = match words.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        Some(LogEntry {
            fence,
            worker,
            accepted,
        })
    }
}

/// What the fenced resource's log says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceCheck {
    /// Writes accepted.
    pub accepted: usize,
    /// Accepted writes whose token was not greater than an earlier accepted one.
    pub stale_accepted: usize,
    /// Writes the script refused as stale.
    pub stale_rejected: usize,
}

impl ResourceCheck {
    /// Checks a log, in the order the resource saw the writes.
    pub fn of(log: &[LogEntry]) -> ResourceCheck {
        let mut check = ResourceCheck::default();
        let mut highest = 0;
        for entry in log {
            if entry.accepted {
                check.accepted += 1;
                if entry.fence <= highest {
                    check.stale_accepted += 1;
                }
                highest = highest.max(entry.fence);
            } else {
                check.stale_rejected += 1;
            }
        }
        check
    }
}
