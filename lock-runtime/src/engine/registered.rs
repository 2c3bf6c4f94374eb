//! The locks this service may be registered for as waiting (in their waiting-services set),
//! as far as its own calls tell: an attempt that may have registered it, a release that
//! yielded with waiters left. An attempt for a lock not listed here goes as a fresh one
//! (`ops.lua`'s `'f'`), which a kind may serve with one write when the lock is free; any other
//! attempt takes the kind's full path, which also removes the service's registration.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ids::{KeyMap, LockKey};

/// Past this many entries, a new one first drops those that ran out.
const PRUNE_AT: usize = 256;

#[derive(Default)]
pub(crate) struct Registered {
    until: Mutex<KeyMap<Instant>>,
}

impl Registered {
    fn map(&self) -> std::sync::MutexGuard<'_, KeyMap<Instant>> {
        self.until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this service is certainly not registered as waiting for `key` now.
    pub(crate) fn fresh(&self, key: &LockKey) -> bool {
        let mut map = self.map();
        match map.get(key) {
            None => true,
            Some(until) if *until <= Instant::now() => {
                map.remove(key);
                true
            }
            Some(_) => false,
        }
    }

    /// A call sent at `sent` may have registered this service for `key` for `horizon`.
    pub(crate) fn note(&self, key: &LockKey, sent: Instant, horizon: Duration) {
        if horizon.is_zero() {
            return;
        }
        let until = sent + horizon;
        let mut map = self.map();
        if map.len() >= PRUNE_AT {
            let now = Instant::now();
            map.retain(|_, until| *until > now);
        }
        let entry = map.entry(key.clone()).or_insert(until);
        *entry = (*entry).max(until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_run_out() {
        let r = Registered::default();
        let key: LockKey = "lock:{a}".into();
        assert!(r.fresh(&key));
        r.note(&key, Instant::now(), Duration::ZERO);
        assert!(r.fresh(&key), "a call that cannot register leaves it fresh");
        r.note(&key, Instant::now(), Duration::from_secs(60));
        assert!(!r.fresh(&key));
        // a shorter registration later does not shorten the one noted
        r.note(&key, Instant::now(), Duration::from_millis(1));
        assert!(!r.fresh(&key));
        let other: LockKey = "lock:{b}".into();
        r.note(
            &other,
            Instant::now() - Duration::from_secs(2),
            Duration::from_secs(1),
        );
        assert!(r.fresh(&other), "ran out");
    }

    #[test]
    fn many_keys_are_pruned() {
        let r = Registered::default();
        let past = Instant::now() - Duration::from_secs(10);
        for i in 0..PRUNE_AT {
            r.note(
                &format!("lock:{{{i}}}").into(),
                past,
                Duration::from_secs(1),
            );
        }
        r.note(
            &"lock:{new}".into(),
            Instant::now(),
            Duration::from_secs(60),
        );
        assert_eq!(r.map().len(), 1);
    }
}
