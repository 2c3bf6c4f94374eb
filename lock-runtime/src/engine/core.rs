//! The engine's core: the state one service (a `LockService` and its clones) shares, and the
//! settings-derived values every operation asks for.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::batcher::Batcher;
use super::ids::OwnerField;
use super::kind::{Kind, MAX_KINDS};
use super::local::Local;
use super::names::{self, KeyNames};
use crate::backend::Backend;
use crate::config::LockConfig;
use crate::error::{ErrorKind, LockError};
use crate::events::Events;
use crate::owner::{OwnerId, process_instance};
use crate::scripts::{self, CHANNEL_SUFFIX, MAX_LEASE_MS};

/// The state one service (a `LockService` and its clones) shares.
pub(crate) struct Engine {
    pub(crate) backend: Backend,
    /// Per kind id: the kind's operations with this service's settings (see [`scripts::ops`]),
    /// built on first use.
    ops_scripts: [OnceLock<scripts::Ops>; MAX_KINDS],
    pub(crate) local: Local,
    pub(crate) config: LockConfig,
    /// Identifies this service among the services waiting for a lock (fair turns between them):
    /// `<instance name>~<random id>`, so that operators see whose it is.
    pub(crate) service_id: String,
    /// What precedes `:<owner>` in the owner fields of this service's holds:
    /// `<instance name>~<random id of the process>`.
    field_prefix: String,
    /// Channels the shared subscriber listens on; the async mutex orders (un)subscriptions.
    pub(crate) subscriptions: tokio::sync::Mutex<HashSet<String>>,
    /// A resubscription after a disconnection is under way (see `notify`).
    pub(crate) resubscribing: std::sync::atomic::AtomicBool,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) batcher: Batcher,
    /// The locks this service may be registered for as waiting (see `registered`).
    pub(crate) registered: super::registered::Registered,
    /// The releases on their way to Redis (see `release`).
    pub(crate) releasing: super::release::Releasing,
    /// What happens to this service's holds, for [`LockService::events`](crate::LockService::events).
    pub(crate) events: Events,
    /// Cancelled when the service shuts down (see `shutdown`): acquires are refused, waits
    /// end, the watchdog and the subscriber stop.
    pub(crate) closing: tokio_util::sync::CancellationToken,
    /// Set when the shutdown begins, before `closing` is cancelled: what every operation asks
    /// (a load, where asking the token takes its lock).
    pub(crate) closed: AtomicBool,
    /// When the service started: the send times its calls carry count from here (see `push`).
    pub(crate) epoch: std::time::Instant,
    /// The kind whose releases push grants across services (the mutex): a pushed grant whose
    /// waiter left is given back as one of its holds.
    pub(crate) pushed_kind: &'static Kind,
    /// The names of the keys locked lately, per namespace (see [`names`](Self::names)).
    names: Mutex<Vec<(Box<str>, NamesByKey)>>,
}

/// The names [`Engine::names`] keeps for one namespace, by user key.
type NamesByKey = HashMap<Box<str>, KeyNames, foldhash::fast::RandomState>;

/// The most keys whose names [`Engine::names`] keeps per namespace; past that it starts over.
const NAMES_KEPT: usize = 4096;

impl Engine {
    /// A service's core; its background tasks are started by the caller.
    pub(crate) fn new(
        backend: Backend,
        config: LockConfig,
        runtime: tokio::runtime::Handle,
        pushed_kind: &'static Kind,
    ) -> Engine {
        let name = config.instance_name();
        Engine {
            ops_scripts: Default::default(),
            registered: Default::default(),
            releasing: Default::default(),
            backend,
            local: Local::default(),
            service_id: format!("{name}~{}", uuid::Uuid::new_v4().simple()),
            field_prefix: format!("{name}~{}", process_instance()),
            config,
            subscriptions: tokio::sync::Mutex::new(HashSet::new()),
            resubscribing: Default::default(),
            batcher: Batcher::new(&runtime),
            runtime,
            events: Default::default(),
            closing: Default::default(),
            closed: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
            names: Mutex::default(),
            pushed_kind,
        }
    }

    /// The owner as stored on Redis: `<instance name>~<process id>:<owner>`, or
    /// `mesh:<owner>` for owners that are the same in every process (see
    /// `inspect::split_owner_field`).
    pub(crate) fn owner_field(&self, owner: &OwnerId) -> OwnerField {
        let prefix = match owner.is_across_processes() {
            true => "mesh",
            false => self.field_prefix.as_str(),
        };
        // joined on the stack when it fits (the shared copy is then its one allocation)
        let id = owner.as_str();
        let len = prefix.len() + 1 + id.len();
        let mut joined = [0u8; 160];
        if let Some(out) = joined.get_mut(..len) {
            out[..prefix.len()].copy_from_slice(prefix.as_bytes());
            out[prefix.len()] = b':';
            out[prefix.len() + 1..].copy_from_slice(id.as_bytes());
            return Arc::from(std::str::from_utf8(out).expect("joined from two strs and ':'"));
        }
        Arc::from([prefix, ":", id].concat())
    }

    /// Identifies the service among the lock domains of a call chain (see `crate::owner`).
    pub(crate) fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// The Redis names of the lock `key` in a kind's `namespace` under this service's prefix.
    ///
    /// The names of the keys locked lately are kept (a key locked again and again is the
    /// common case), at most [`NAMES_KEPT`] per namespace.
    pub(crate) fn names(&self, namespace: &str, key: &str) -> Result<KeyNames, LockError> {
        let mut kept = self.names.lock().unwrap_or_else(|p| p.into_inner());
        let at = match kept.iter().position(|(ns, _)| &**ns == namespace) {
            Some(at) => at,
            None => {
                kept.push((namespace.into(), HashMap::default()));
                kept.len() - 1
            }
        };
        let by_key = &mut kept[at].1;
        if let Some(names) = by_key.get(key) {
            return Ok(names.clone());
        }
        let names = KeyNames::in_namespace(self.config.prefix(), namespace, key)
            .map_err(|e| e.with_key(key))?;
        if by_key.len() >= NAMES_KEPT {
            by_key.clear();
        }
        by_key.insert(key.into(), names.clone());
        Ok(names)
    }

    /// The fence counter the lock `names` draws its tokens from: the counter of its slot in
    /// Redis Cluster, the server's one counter on one server (see [`scripts::OpKeys`]).
    pub(crate) fn fence_counter(&self, names: &KeyNames) -> String {
        if self.backend.is_cluster() {
            names.fence().to_owned()
        } else {
            names::server_counter(self.config.prefix())
        }
    }

    /// The operations script of `kind` with this service's settings.
    pub(crate) fn ops_script(&self, kind: &Kind) -> &scripts::Ops {
        self.ops_scripts[kind.id].get_or_init(|| {
            let counter = names::server_counter(self.config.prefix());
            let keys = if self.backend.is_cluster() {
                scripts::OpKeys::Declared
            } else {
                scripts::OpKeys::Named { counter: &counter }
            };
            scripts::ops(
                kind.lua_first,
                kind.lua,
                kind.fourth_key,
                keys,
                kind.extra_arg,
                self.backend.publish_command(),
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

    /// The error of a lock call that would wait for a guard that a lock call made at the same
    /// site holds (see [`Site`](crate::owner::Site)): waiting could never end.
    pub(crate) fn would_deadlock_error(kind: &Kind, names: &KeyNames) -> LockError {
        LockError::new(
            ErrorKind::WouldDeadlock,
            format!(
                "{} `{}` is held by a guard that this code holds itself: a lock call made at \
                 the same place of the call chain (outside any locked body, or directly in the \
                 same one) as an earlier call whose guard is still alive would wait for that \
                 guard, which is released only after this call returns. Lock calls are not \
                 counted per task: they re-enter the holds of enclosing locked bodies. To \
                 re-enter, run the inner part as a locked body - `.run(|held| ...)` on the \
                 first lock call, or a #[distributed_lock] fn - and lock again inside it \
                 (nested `run` bodies and annotated fns re-enter), or release the first guard \
                 first. Concurrent children of one task that lock the same key (`join!`, \
                 `select!`) are refused the same way: make them locked bodies, chains of \
                 their own (`owner::chain`) or tasks",
                kind.noun, names.user
            ),
        )
        .with_key(&names.user)
    }

    /// How long this service stays registered as waiting after a failed attempt sent at `sent`:
    /// until it will have tried again at the latest (0: it will not wait, do not register).
    pub(crate) fn waiter_horizon(&self, deadline: Option<Instant>, sent: Instant) -> u64 {
        Self::horizon(&self.config, deadline, sent)
    }

    /// [`waiter_horizon`](Self::waiter_horizon) for a service with `config` (also before it
    /// exists: the release script takes the horizon without a deadline as a constant).
    pub(crate) fn waiter_horizon_of(config: &LockConfig, deadline: Option<Instant>) -> u64 {
        Self::horizon(config, deadline, Instant::now())
    }

    fn horizon(config: &LockConfig, deadline: Option<Instant>, from: Instant) -> u64 {
        let cap = config.watchdog_timeout();
        let left = match deadline {
            Some(d) => d.saturating_duration_since(from).min(cap),
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

pub(crate) fn replica_sync_error(inner: &Engine, names: &KeyNames) -> LockError {
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
