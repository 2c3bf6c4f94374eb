//! The replies of the kinds' `acquire` and `release` functions (see `scripts/ops.lua`).

use std::time::Duration;

use super::names::KeyNames;
use crate::error::{ErrorKind, LockError};

/// The reply of a kind's `acquire`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    /// Granted to this attempt.
    Granted(u64),
    /// The owner holds it under this attempt's grant id: a confirmed re-entry, or an attempt
    /// that had run before (for a fresh attempt, a grant like [`Attempt::Granted`]).
    Holding(u64),
    /// Not granted; look again in about this long. `room`: the kind says another request
    /// might be granted now (a semaphore with some permits free, a read refused only because
    /// writers wait): the next waiter may try.
    Held { retry: Duration, room: bool },
}

/// What an acquire attempt asks of the kind's `acquire`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A new grant; stay registered as waiting for this many ms after a failure (0: do not).
    /// `fresh`: this service is not registered as waiting for the lock (see `registered`).
    Grant { horizon_ms: u64, fresh: bool },
    /// Confirm (and extend) the owner's grant with this attempt's grant id; never grant.
    Confirm,
    /// A new grant without waiting, in a run of such operations sent in one call that stops
    /// at the first one not granted (the later ones are not run).
    Chained,
}

impl Ask {
    /// The horizon argument of the kind's `acquire`.
    pub(crate) fn horizon_arg(self) -> i64 {
        match self {
            Ask::Grant { horizon_ms, .. } => i64::try_from(horizon_ms).unwrap_or(i64::MAX),
            Ask::Confirm => -1,
            Ask::Chained => 0,
        }
    }
}

/// The reply of a kind's `release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    NotHeld,
    StillHeld,
    Freed { yielded: bool },
    HandedOff(u64),
}

fn bad_reply(script: &str, names: &KeyNames, reply: &[i64]) -> LockError {
    LockError::new(
        ErrorKind::Backend,
        format!(
            "unexpected reply {reply:?} from the {script} script for lock `{}`",
            names.user
        ),
    )
    .with_key(&names.user)
}

fn token(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(crate) fn parse_attempt(reply: &[i64; 3], names: &KeyNames) -> Result<Attempt, LockError> {
    match reply {
        [1, token_value, _] => Ok(Attempt::Granted(token(*token_value))),
        [2, token_value, _grants] => Ok(Attempt::Holding(token(*token_value))),
        [0, ttl, room] => Ok(Attempt::Held {
            retry: if *ttl >= 0 {
                Duration::from_millis(*ttl as u64)
            } else {
                // no expiry (set by someone else) or just gone: look again soon
                Duration::from_millis(100)
            },
            room: *room > 0,
        }),
        _ => Err(bad_reply("acquire", names, reply)),
    }
}

pub(crate) fn parse_released(reply: &[i64; 3], names: &KeyNames) -> Result<Released, LockError> {
    match reply {
        [0, _, _] => Ok(Released::NotHeld),
        [1, _, _] => Ok(Released::StillHeld),
        [2, yielded, _] => Ok(Released::Freed {
            yielded: *yielded == 1,
        }),
        [3, token_value, _] => Ok(Released::HandedOff(token(*token_value))),
        _ => Err(bad_reply("release", names, reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse() {
        let n = KeyNames::in_namespace("p:", "", "k").unwrap();
        assert!(matches!(
            parse_attempt(&[1, 9, 0], &n),
            Ok(Attempt::Granted(9))
        ));
        assert!(matches!(
            parse_attempt(&[2, 9, 2], &n),
            Ok(Attempt::Holding(9))
        ));
        assert!(
            matches!(parse_attempt(&[0, 50, 0], &n), Ok(Attempt::Held { retry, room: false }) if retry.as_millis() == 50)
        );
        assert!(parse_attempt(&[7, 0, 0], &n).is_err());
        assert_eq!(
            parse_released(&[3, 5, 0], &n).unwrap(),
            Released::HandedOff(5)
        );
        assert_eq!(
            parse_released(&[2, 1, 0], &n).unwrap(),
            Released::Freed { yielded: true }
        );
        assert!(parse_released(&[-1, 0, 0], &n).is_err());
    }
}
