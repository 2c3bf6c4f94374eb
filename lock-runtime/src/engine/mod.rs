//! The engine every lock kind runs on: acquire with waiting (`acquire`), release with hand-off
//! and give-back of grants nobody will use (`release`), shared script calls (`batch`), the
//! in-process holds and waiter lines (`local`), the guard core (`guard`), renewal (`watchdog`)
//! and wake-ups (`notify`). It knows no kind: a kind describes itself with a [`Kind`] (its
//! scripts, whether its holds are shared, re-entrant, handed off) and the engine does the rest.
//!
//! Redis calls that change lock state run in their own tasks and report back over a channel, so
//! cancelling the caller's future never loses a reply: a grant that arrives after its caller left
//! is released right away, and a release always completes its bookkeeping.

mod acquire;
pub(crate) mod batch;
pub(crate) mod guard;
mod holds;
mod kind;
mod line;
pub(crate) mod local;
pub(crate) mod notify;
mod release;
pub(crate) mod watchdog;

pub(crate) use guard::Guard;
pub(crate) use kind::{Kind, MAX_KINDS};

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::config::LockConfig;
use crate::error::{ErrorKind, LockError};
use crate::owner::{OwnerId, process_instance};
use crate::scripts::{self, CHANNEL_SUFFIX, FENCE_SUFFIX, MAX_LEASE_MS, QUEUE_SUFFIX, TURN_SUFFIX};
use batch::Batcher;
use local::{Local, LockKey, OwnerField};

/// The state one service (a `LockService` and its clones) shares.
pub(crate) struct Inner {
    pub(crate) backend: Backend,
    /// Per kind id: the kind's operations with this service's settings (see [`scripts::ops`]),
    /// built on first use.
    ops_scripts: [OnceLock<redis::Script>; MAX_KINDS],
    pub(crate) local: Local,
    pub(crate) config: LockConfig,
    /// Identifies this service among the services waiting for a lock (fair turns between them).
    pub(crate) service_id: String,
    /// Channels the shared subscriber listens on; the async mutex orders (un)subscriptions.
    pub(crate) subscriptions: tokio::sync::Mutex<HashSet<String>>,
    /// A resubscription after a disconnection is under way (see `notify`).
    pub(crate) resubscribing: std::sync::atomic::AtomicBool,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) batcher: Batcher,
    /// What happens to this service's holds, for [`LockService::events`](crate::LockService::events).
    pub(crate) events: crate::events::Events,
}

/// What an acquire is for: the kind, the lock's Redis names and the kind's extra argument to
/// its acquire script (e.g. a semaphore's permit counts; empty for most kinds), and the
/// bounded name metrics and events give the lock (see `crate::metrics`).
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) kind: &'static Kind,
    pub(crate) names: KeyNames,
    pub(crate) extra: Arc<str>,
    pub(crate) label: &'static str,
}

impl Target {
    pub(crate) fn new(kind: &'static Kind, names: KeyNames) -> Target {
        Target {
            kind,
            names,
            extra: "".into(),
            label: crate::metrics::OTHER,
        }
    }
}

/// The Redis names of one lock: the lock key, and the keys and channel named after it (made
/// when needed: the scripts name them themselves).
#[derive(Clone, Debug)]
pub(crate) struct KeyNames {
    /// The key as the caller wrote it.
    pub(crate) user: Arc<str>,
    pub(crate) lock: LockKey,
}

impl KeyNames {
    /// `<prefix><namespace>{<key>}` (kinds other than the mutex have a namespace of their own,
    /// such as `rw:`), with `%`, `{` and `}` in the key written as `%25`, `%7B` and `%7D`:
    /// the hash tag (and so the cluster slot) is always the whole key, whatever text the key
    /// was built from, and since a lock key always ends with `}`, no key can name another
    /// lock's fence counter, waiting set or turn marker (`<lock key>:fence` and so on).
    pub(crate) fn new(prefix: &str, key: &str) -> Result<KeyNames, LockError> {
        Self::in_namespace(prefix, "", key)
    }

    /// [`new`](Self::new) in a kind's namespace: no key of one namespace can name a key of
    /// another (the character after the prefix is always `{` for the mutex, a letter for the
    /// others).
    pub(crate) fn in_namespace(
        prefix: &str,
        namespace: &str,
        key: &str,
    ) -> Result<KeyNames, LockError> {
        if key.is_empty() {
            return Err(LockError::new(
                ErrorKind::InvalidKey,
                "lock key is empty; give every lock a name such as \"goods:42\"",
            ));
        }
        let mut lock = String::with_capacity(prefix.len() + namespace.len() + key.len() + 2);
        lock.push_str(prefix);
        lock.push_str(namespace);
        lock.push('{');
        for c in key.chars() {
            match c {
                '%' => lock.push_str("%25"),
                '{' => lock.push_str("%7B"),
                '}' => lock.push_str("%7D"),
                c => lock.push(c),
            }
        }
        lock.push('}');
        Ok(KeyNames {
            user: key.into(),
            lock: lock.into(),
        })
    }

    /// The fence counter.
    pub(crate) fn fence(&self) -> String {
        format!("{}{FENCE_SUFFIX}", self.lock)
    }

    /// The set of services waiting for the lock.
    pub(crate) fn queue(&self) -> String {
        format!("{}{QUEUE_SUFFIX}", self.lock)
    }

    /// The marker of the service whose turn it is.
    pub(crate) fn turn(&self) -> String {
        format!("{}{TURN_SUFFIX}", self.lock)
    }

    /// The wake-up channel.
    pub(crate) fn channel(&self) -> String {
        format!("{}{CHANNEL_SUFFIX}", self.lock)
    }
}

/// The reply of a kind's `acquire`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    /// Granted to this attempt.
    Granted(u64),
    /// The owner holds it under this attempt's grant id: a confirmed re-entry, or an attempt
    /// that had run before (for a fresh attempt, a grant like [`Attempt::Granted`]).
    Holding(u64),
    /// Not granted; look again in about this long. `room`: the kind says a smaller request
    /// might be granted now (a semaphore with some permits free): the next waiter may try.
    Held { retry: Duration, room: bool },
}

/// What an acquire attempt asks of the kind's `acquire`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A new grant; stay registered as waiting for this many ms after a failure (0: do not).
    Grant { horizon_ms: u64 },
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
            Ask::Grant { horizon_ms } => i64::try_from(horizon_ms).unwrap_or(i64::MAX),
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

/// The owner as stored on Redis: prefixed with this process's instance id, or with `mesh` for
/// owners that are the same in every process.
pub(crate) fn owner_field(owner: &OwnerId) -> OwnerField {
    if owner.is_across_processes() {
        format!("mesh:{owner}").into()
    } else {
        format!("{}:{owner}", process_instance()).into()
    }
}

impl Inner {
    /// A service's core; its background tasks are started by the caller.
    pub(crate) fn new(
        backend: Backend,
        config: LockConfig,
        runtime: tokio::runtime::Handle,
    ) -> Inner {
        Inner {
            ops_scripts: Default::default(),
            backend,
            local: Local::default(),
            config,
            service_id: uuid::Uuid::new_v4().simple().to_string(),
            subscriptions: tokio::sync::Mutex::new(HashSet::new()),
            resubscribing: Default::default(),
            runtime,
            batcher: Default::default(),
            events: Default::default(),
        }
    }

    /// The operations script of `kind` with this service's settings.
    pub(crate) fn ops_script(&self, kind: &Kind) -> &redis::Script {
        self.ops_scripts[kind.id].get_or_init(|| {
            scripts::ops(
                kind.lua,
                self.backend.publish_command(),
                Self::fence_ttl_ms_of(&self.config),
                Self::waiter_horizon_of(&self.config, None),
            )
        })
    }

    pub(crate) fn millis(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// Checks a lease before anything is sent.
    pub(crate) fn check_lease(
        kind: &Kind,
        names: &KeyNames,
        lease: Option<Duration>,
    ) -> Result<(), LockError> {
        let Some(lease) = lease else { return Ok(()) };
        if lease < Duration::from_millis(1) || lease.as_millis() > u128::from(MAX_LEASE_MS) {
            return Err(LockError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{} `{}` requested with a lease of {lease:?}; a lease is from 1ms to {} \
                     days (or none: the watchdog keeps the lock while it is held)",
                    kind.noun,
                    names.user,
                    MAX_LEASE_MS / 86_400_000
                ),
            )
            .with_key(&names.user));
        }
        Ok(())
    }

    /// The fence counter's idle TTL as the scripts take it (0: never expires).
    pub(crate) fn fence_ttl_ms_of(config: &LockConfig) -> u64 {
        config.fence_idle_ttl().map_or(0, Self::millis)
    }

    /// The error of a wait that ran out; it names the configured wait, so that logs group.
    pub(crate) fn timeout_error(&self, kind: &Kind, names: &KeyNames, wait: Duration) -> LockError {
        LockError::new(
            ErrorKind::Timeout,
            format!(
                "could not acquire {} `{}` within {wait:?}: {}",
                kind.noun, names.user, kind.busy,
            ),
        )
        .with_key(&names.user)
    }

    /// How long this service stays registered as waiting after a failed attempt: until it
    /// will have tried again at the latest (0: it will not wait, do not register).
    pub(crate) fn waiter_horizon(&self, deadline: Option<Instant>) -> u64 {
        Self::waiter_horizon_of(&self.config, deadline)
    }

    /// [`waiter_horizon`](Self::waiter_horizon) for a service with `config` (also before it
    /// exists: the release script takes the horizon without a deadline as a constant).
    pub(crate) fn waiter_horizon_of(config: &LockConfig, deadline: Option<Instant>) -> u64 {
        let cap = config.watchdog_timeout();
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(cap),
            None => cap,
        };
        if left.is_zero() {
            0
        } else {
            Self::millis(left) + 1_000
        }
    }

    /// Subscribes the shared subscriber to `channel` unless it already is; returns whether it
    /// subscribed now.
    pub(crate) async fn ensure_subscribed(&self, channel: &str) -> Result<bool, LockError> {
        let mut subscribed = self.subscriptions.lock().await;
        if subscribed.contains(channel) {
            return Ok(false);
        }
        self.backend.subscribe(channel).await?;
        subscribed.insert(channel.to_owned());
        Ok(true)
    }

    /// Unsubscribes from the channels nobody in this process waits on any more.
    pub(crate) async fn unsubscribe_idle(&self) {
        let mut subscribed = self.subscriptions.lock().await;
        let idle: Vec<String> = subscribed
            .iter()
            .filter(|ch| {
                let key = ch.strip_suffix(CHANNEL_SUFFIX).unwrap_or(ch);
                !self.local.has_waiters(key)
            })
            .cloned()
            .collect();
        if idle.is_empty() {
            return;
        }
        // Forgotten also when the call failed: it may have run (a reply that timed out; on a
        // cluster, the channels before the one that failed), and a channel believed subscribed
        // while it is not would keep its next waiters from ever hearing a release. One still
        // subscribed is only subscribed again when someone waits on it (idempotent).
        if let Err(e) = self.backend.unsubscribe(&idle).await {
            tracing::debug!(error = %e, "unsubscribe failed; the channels are subscribed again when needed");
        }
        for ch in &idle {
            subscribed.remove(ch);
        }
    }
}

pub(crate) fn replica_sync_error(inner: &Inner, names: &KeyNames) -> LockError {
    LockError::new(
        ErrorKind::ReplicaSync,
        format!(
            "lock `{}` was granted but fewer than {} replicas acknowledged it within {:?} \
             (redis.sync_replicas / redis.sync_timeout); the grant was given back",
            names.user,
            inner.config.sync_replicas(),
            inner.config.sync_timeout()
        ),
    )
    .with_key(&names.user)
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
    fn key_names_use_a_hash_tag() {
        let n = KeyNames::new("lock:", "goods:42").unwrap();
        assert_eq!(&*n.lock, "lock:{goods:42}");
        assert_eq!(n.fence(), "lock:{goods:42}:fence");
        assert_eq!(n.channel(), "lock:{goods:42}:ch");
        // braces from the key never choose the hash tag, and a key can never name another
        // lock's counter, waiting set or turn marker
        let n = KeyNames::new("lock:", "shop:{7}:goods:1").unwrap();
        assert_eq!(&*n.lock, "lock:{shop:%7B7%7D:goods:1}");
        let n = KeyNames::new("lock:", "a}:x{b").unwrap();
        assert_eq!(&*n.lock, "lock:{a%7D:x%7Bb}");
        let victim = KeyNames::new("lock:", "a{t}").unwrap();
        for reserved in [":fence", ":wq", ":turn", ":ch"] {
            let n = KeyNames::new("lock:", &format!("a{{t}}{reserved}")).unwrap();
            assert_ne!(*n.lock, *format!("{}{reserved}", victim.lock));
            assert!(n.lock.ends_with('}'));
        }
        let n = KeyNames::new("lock:", "100%").unwrap();
        assert_eq!(&*n.lock, "lock:{100%25}");
        assert_ne!(n.lock, KeyNames::new("lock:", "100%25").unwrap().lock);
        let e = KeyNames::new("lock:", "").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidKey);
    }

    #[test]
    fn replies_parse() {
        let n = KeyNames::new("p:", "k").unwrap();
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
