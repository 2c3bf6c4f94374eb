//! The shared core of a [`LockService`](crate::LockService): acquire with waiting, release with
//! hand-off, give-back of grants nobody will use.
//!
//! Redis calls that change lock state run in their own tasks and report back over a channel, so
//! cancelling the caller's future never loses a reply: a grant that arrives after its caller left
//! is released right away, and a release always completes its bookkeeping.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::backend::Backend;
use crate::batch::{Batcher, Op};
use crate::config::LockConfig;
use crate::detach::Detachable;
use crate::error::{ErrorKind, LockError};
use crate::guard::LockGuard;
use crate::local::{
    GrantId, Local, LockKey, OwnerField, ReleaseEnd, ReleasePlan, Reservation, Turn, new_grant_id,
};
use crate::owner::{OwnerId, process_instance};
use crate::scripts::{
    self, CHANNEL_SUFFIX, FENCE_SUFFIX, MAX_LEASE_MS, QUEUE_SUFFIX, ScriptCall, TURN_SUFFIX,
};

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    /// `ops.lua` with this service's settings (see [`scripts::ops`]).
    pub(crate) ops_script: redis::Script,
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
    /// `<prefix>{<key>}`, with `%`, `{` and `}` in the key written as `%25`, `%7B` and `%7D`:
    /// the hash tag (and so the cluster slot) is always the whole key, whatever text the key
    /// was built from, and since a lock key always ends with `}`, no key can name another
    /// lock's fence counter, waiting set or turn marker (`<lock key>:fence` and so on).
    pub(crate) fn new(prefix: &str, key: &str) -> Result<KeyNames, LockError> {
        if key.is_empty() {
            return Err(LockError::new(
                ErrorKind::InvalidKey,
                "lock key is empty; give every lock a name such as \"goods:42\"",
            ));
        }
        let mut lock = String::with_capacity(prefix.len() + key.len() + 2);
        lock.push_str(prefix);
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

/// The reply of `acquire.lua`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    /// Granted to this attempt.
    Granted(u64),
    /// The owner holds it under this attempt's grant id: a confirmed re-entry, or an attempt
    /// that had run before (for a fresh attempt, a grant like [`Attempt::Granted`]).
    Holding(u64),
    Held(Duration),
}

/// What an acquire attempt asks of `acquire.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A new grant; stay registered as waiting for this many ms after a failure (0: do not).
    Grant { horizon_ms: u64 },
    /// Confirm (and extend) the owner's grant with this attempt's grant id; never grant.
    Confirm,
}

impl Ask {
    /// The horizon argument of `acquire.lua`.
    pub(crate) fn horizon_arg(self) -> i64 {
        match self {
            Ask::Grant { horizon_ms } => i64::try_from(horizon_ms).unwrap_or(i64::MAX),
            Ask::Confirm => -1,
        }
    }
}

/// The reply of `release.lua`.
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

type Detached<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Inner {
    fn millis(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// Acquires `names` for `owner`, waiting up to `wait` (`None`: until acquired).
    pub(crate) async fn acquire(
        self: Arc<Self>,
        names: KeyNames,
        owner: OwnerId,
        lease: Option<Duration>,
        wait: Option<Duration>,
    ) -> Result<LockGuard, LockError> {
        let span = tracing::info_span!(
            "lock.acquire",
            key = %names.user,
            owner = %owner,
            fence = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        );
        let started = Instant::now();
        // a wait too long to count in an Instant is forever
        let deadline = wait.and_then(|w| started.checked_add(w));
        let result = self
            .acquire_inner(names, owner, lease, deadline, wait.unwrap_or(Duration::MAX))
            .instrument(span.clone())
            .await;
        span.record("waited_ms", started.elapsed().as_millis() as u64);
        if let Ok(guard) = &result {
            span.record("fence", guard.fence());
        }
        result
    }

    async fn acquire_inner(
        self: &Arc<Self>,
        names: KeyNames,
        owner: OwnerId,
        lease: Option<Duration>,
        deadline: Option<Instant>,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        let field = owner_field(&owner);
        let lease_ms = Self::millis(lease.unwrap_or(self.config.watchdog_timeout()));
        let watched = lease.is_none();
        let guard = |inner: &Arc<Self>, token, grant: &GrantId, cell| {
            LockGuard::new(
                inner.clone(),
                names.clone(),
                owner.clone(),
                field.clone(),
                grant.clone(),
                token,
                lease,
                cell,
            )
        };

        // Re-entry: the owner holds the key here already, so it must not queue behind waiters
        // that wait for it. Redis confirms that grant (and extends it to this lease); if it is
        // gone, its guards are lost and this call waits for a new grant like any other.
        if let Some(grant) = self.local.holding(&names.lock, &field) {
            let sent = Instant::now();
            match self
                .attempt(&names, &field, &grant, lease_ms, Ask::Confirm)
                .await?
            {
                Attempt::Granted(token) | Attempt::Holding(token) => {
                    if let Some(cell) =
                        self.local
                            .add_guard(&names.lock, &grant, watched, sent, lease_ms)
                    {
                        return Ok(guard(self, token, &grant, cell));
                    }
                }
                Attempt::Held(_) => self.local.drop_grant(&names.lock, &grant),
            }
        }

        let grant = new_grant_id();
        let (id, wake) = self
            .local
            .enqueue(&names.lock, &field, &grant, lease_ms, watched);
        let mut ticket = Ticket {
            inner: self,
            names: &names,
            id,
            done: false,
        };
        let mut subscribed = false;
        loop {
            let mut hint = None;
            match self.local.turn(&names.lock, id) {
                Turn::Granted { token, since } => {
                    ticket.done = true;
                    let cell = self.local.leave_granted(&names.lock, id, since);
                    return Ok(guard(self, token, &grant, cell));
                }
                Turn::Wait => {}
                Turn::Behind { until } => {
                    hint = Some(
                        until.saturating_duration_since(Instant::now()) + Duration::from_millis(1),
                    );
                }
                Turn::Attempt => {
                    let sent = Instant::now();
                    let horizon_ms = self.waiter_horizon(deadline);
                    match self
                        .attempt(&names, &field, &grant, lease_ms, Ask::Grant { horizon_ms })
                        .await?
                    {
                        Attempt::Granted(token) | Attempt::Holding(token) => {
                            ticket.done = true;
                            let cell = self.local.leave_granted(&names.lock, id, sent);
                            return Ok(guard(self, token, &grant, cell));
                        }
                        Attempt::Held(ttl) => {
                            self.local.park(&names.lock, id);
                            let out_of_time = deadline.is_some_and(|d| Instant::now() >= d);
                            if !subscribed && !out_of_time {
                                // Subscribe, then try again: a release between the failed
                                // attempt and the subscription would otherwise go unnoticed.
                                self.ensure_subscribed(&names.channel()).await?;
                                subscribed = true;
                                continue;
                            }
                            let jitter = rand::rng().random_range(1..=20);
                            hint = Some(ttl + Duration::from_millis(jitter));
                        }
                    }
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                ticket.leave_now().await;
                return Err(self.timeout_error(&names, wait));
            }
            wait_for(&wake, hint, deadline).await;
        }
    }

    /// Checks a lease before anything is sent.
    pub(crate) fn check_lease(names: &KeyNames, lease: Option<Duration>) -> Result<(), LockError> {
        let Some(lease) = lease else { return Ok(()) };
        if lease < Duration::from_millis(1) || lease.as_millis() > u128::from(MAX_LEASE_MS) {
            return Err(LockError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "lock `{}` requested with a lease of {lease:?}; a lease is from 1ms to {} \
                     days (or none: the watchdog keeps the lock while it is held)",
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
    pub(crate) fn timeout_error(&self, names: &KeyNames, wait: Duration) -> LockError {
        LockError::new(
            ErrorKind::Timeout,
            format!(
                "could not acquire lock `{}` within {wait:?}: it is held by another owner",
                names.user,
            ),
        )
        .with_key(&names.user)
    }

    /// How long this service stays registered as waiting after a failed attempt: until it
    /// will have tried again at the latest (0: it will not wait, do not register).
    fn waiter_horizon(&self, deadline: Option<Instant>) -> u64 {
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

    /// One acquire (`acquire.lua`) with the grant id `grant`. The call completes even if the
    /// caller goes away. A grant nobody will use is given back: one that arrives after the
    /// caller left, and - for [`Ask::Grant`] - any call whose outcome is unknown (it failed or
    /// timed out, whether or not the caller still waits), since Redis may run it later. The
    /// give-back releases that grant id only, so it never frees a hold that was already there.
    async fn attempt(
        self: &Arc<Self>,
        names: &KeyNames,
        field: &OwnerField,
        grant: &GrantId,
        lease_ms: u64,
        ask: Ask,
    ) -> Result<Attempt, LockError> {
        let (inner, n, f, g) = (self.clone(), names.clone(), field.clone(), grant.clone());
        let call = async move { inner.run_acquire(&n, &f, &g, lease_ms, ask).await };
        let (inner, n, f, g) = (self.clone(), names.clone(), field.clone(), grant.clone());
        let orphan = move |reply: Result<Attempt, LockError>| {
            let give_back = match &reply {
                Ok(Attempt::Granted(_) | Attempt::Holding(_)) => ask != Ask::Confirm,
                Err(_) => ask != Ask::Confirm,
                Ok(Attempt::Held(_)) => false,
            };
            if give_back {
                tracing::debug!(key = %n.user, ?reply, "acquire cancelled, giving the grant back");
                inner.give_back(n, f, g);
            }
        };
        let reply = Detachable::new(&self.runtime, call, orphan).await;
        if let Err(e) = &reply
            && ask != Ask::Confirm
        {
            tracing::debug!(key = %names.user, error = %e, "acquire failed; giving back whatever it may have granted");
            self.give_back(names.clone(), field.clone(), grant.clone());
        }
        reply
    }

    async fn run_acquire(
        self: &Arc<Self>,
        names: &KeyNames,
        field: &OwnerField,
        grant: &GrantId,
        lease_ms: u64,
        ask: Ask,
    ) -> Result<Attempt, LockError> {
        let synced = self
            .run_op(Op::Acquire {
                names: names.clone(),
                owner: field.clone(),
                grant: grant.clone(),
                lease_ms,
                ask,
            })
            .await?;
        match parse_attempt(&synced.reply, names)? {
            Attempt::Granted(_) | Attempt::Holding(_)
                if !synced.acknowledged && ask != Ask::Confirm =>
            {
                // not replicated: a failover could hand the lock to someone else
                self.give_back(names.clone(), field.clone(), grant.clone());
                Err(replica_sync_error(self, names))
            }
            attempt => Ok(attempt),
        }
    }

    /// Releases one guard of grant `grant` in the background: drops the guard's bookkeeping
    /// now, then (for a grant's last guard) runs `release.lua`, handing the lock to a parked
    /// waiter of this service when it can.
    pub(crate) fn release_detached(
        self: &Arc<Self>,
        names: KeyNames,
        field: OwnerField,
        grant: GrantId,
        watched: bool,
    ) -> tokio::task::JoinHandle<Result<Released, LockError>> {
        self.runtime
            .spawn(self.release_call(names, field, grant, Some(watched), true))
    }

    /// Like [`release_detached`](Self::release_detached), but runs inline for a caller that
    /// awaits it; if the caller goes away, the release still completes in a task.
    pub(crate) fn release_now(
        self: &Arc<Self>,
        names: KeyNames,
        field: OwnerField,
        grant: GrantId,
        watched: bool,
    ) -> Detachable<Result<Released, LockError>> {
        Detachable::new(
            &self.runtime,
            self.release_call(names, field, grant, Some(watched), true),
            drop,
        )
    }

    /// Gives back the grant `grant` (one nobody will use, or whose outcome is unknown) in the
    /// background, handing the lock to a parked waiter of this service when it can. Releasing
    /// a grant id that was never granted changes nothing; a call that fails is repeated until
    /// Redis answers (see [`repeat_release`](Self::repeat_release)).
    pub(crate) fn give_back(self: &Arc<Self>, names: KeyNames, field: OwnerField, grant: GrantId) {
        let call = self.release_call(names, field, grant, None, true);
        self.runtime.spawn(call);
    }

    /// The bookkeeping happens now; the returned future runs the script when it is needed.
    fn release_call(
        self: &Arc<Self>,
        names: KeyNames,
        field: OwnerField,
        grant: GrantId,
        guard: Option<bool>,
        hand_off: bool,
    ) -> Detached<Result<Released, LockError>> {
        match self
            .local
            .begin_release(&names.lock, &grant, guard, hand_off)
        {
            ReleasePlan::Local => Box::pin(std::future::ready(Ok(Released::StillHeld))),
            ReleasePlan::NotHeld => Box::pin(std::future::ready(Ok(Released::NotHeld))),
            ReleasePlan::Redis(reservation) => {
                Box::pin(
                    self.clone()
                        .finish_release(names, field, grant, reservation),
                )
            }
        }
    }

    async fn finish_release(
        self: Arc<Self>,
        names: KeyNames,
        field: OwnerField,
        grant: GrantId,
        reservation: Option<Reservation>,
    ) -> Result<Released, LockError> {
        let op = Op::Release {
            names: names.clone(),
            owner: field.clone(),
            grant: grant.clone(),
            next: reservation
                .as_ref()
                .map(|r| (r.owner.clone(), r.grant.clone(), r.lease_ms)),
        };
        let reply = match self.run_op(op).await {
            Ok(synced) => match parse_released(&synced.reply, &names) {
                // a hand-off is a grant: it needs the replicas' acknowledgement like any other
                Ok(Released::HandedOff(_)) if !synced.acknowledged => {
                    if let Some(r) = &reservation {
                        self.give_back_plain(names.clone(), r.owner.clone(), r.grant.clone());
                    }
                    Ok(Released::Freed { yielded: false })
                }
                other => other,
            },
            Err(e) => Err(e),
        };
        let end = match &reply {
            Ok(Released::HandedOff(token)) => ReleaseEnd::HandedOff(*token),
            Ok(Released::Freed { .. }) => ReleaseEnd::Freed,
            Ok(_) => ReleaseEnd::Unchanged,
            Err(_) => ReleaseEnd::Unknown,
        };
        if let Some(orphan) = self.local.end_release(&names.lock, reservation, end) {
            tracing::debug!(key = %names.user, "hand-off target left, giving the lock back");
            self.give_back(names.clone(), orphan.owner, orphan.grant);
        }
        if let Err(e) = &reply {
            // The release may not have run: repeat it (without a hand-off) until Redis answers,
            // so the lock is not left held for its whole lease.
            tracing::debug!(key = %names.user, error = %e, "release failed; repeating it in the background");
            self.runtime
                .spawn(self.clone().repeat_release(names, field, grant));
        }
        reply
    }

    /// Repeats the release of `grant` until Redis answers, for at most a minute or the
    /// watchdog timeout, whichever is longer (a grant with a longer fixed lease is left to it).
    async fn repeat_release(self: Arc<Self>, names: KeyNames, field: OwnerField, grant: GrantId) {
        let started = Instant::now();
        let give_up = self.config.watchdog_timeout().max(Duration::from_secs(60));
        let mut pause = Duration::from_millis(20);
        while started.elapsed() < give_up {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
            let op = Op::Release {
                names: names.clone(),
                owner: field.clone(),
                grant: grant.clone(),
                next: None,
            };
            match self.run_op(op).await {
                Ok(_) => {
                    self.local.wake_head(&names.lock);
                    return;
                }
                Err(e) => tracing::debug!(key = %names.user, error = %e, "release failed again"),
            }
        }
        tracing::warn!(key = %names.user, "could not release a lock; it expires with its lease");
    }

    /// Gives back a grant without handing it to a waiter of this service (used when the grant
    /// was not replicated: handing it over would only repeat that).
    fn give_back_plain(self: &Arc<Self>, names: KeyNames, field: OwnerField, grant: GrantId) {
        drop(
            self.runtime
                .spawn(self.release_call(names, field, grant, None, false)),
        );
    }

    /// Subscribes the shared subscriber to `channel` unless it already is.
    pub(crate) async fn ensure_subscribed(&self, channel: &str) -> Result<(), LockError> {
        let mut subscribed = self.subscriptions.lock().await;
        if !subscribed.contains(channel) {
            self.backend.subscribe(channel).await?;
            subscribed.insert(channel.to_owned());
        }
        Ok(())
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
        match self.backend.unsubscribe(&idle).await {
            Ok(()) => {
                for ch in &idle {
                    subscribed.remove(ch);
                }
            }
            Err(e) => tracing::debug!(error = %e, "unsubscribe failed; will retry"),
        }
    }
}

/// A place in a waiter line; leaving it (drop) gives back a hand-off that already arrived.
struct Ticket<'a> {
    inner: &'a Arc<Inner>,
    names: &'a KeyNames,
    id: u64,
    done: bool,
}

impl Ticket<'_> {
    /// Leaves the line; when nobody of this service waits any more, deregisters the service as
    /// waiting so that releases elsewhere do not give it a turn. Returns the deregistration
    /// call when one is due, to await or spawn.
    fn leave(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        self.done = true;
        let (orphan, line_empty) = self.inner.local.leave(&self.names.lock, self.id);
        if let Some(orphan) = orphan {
            self.inner
                .give_back(self.names.clone(), orphan.owner, orphan.grant);
            return None;
        }
        if !line_empty {
            return None;
        }
        let (inner, queue) = (self.inner.clone(), self.names.queue());
        Some(async move {
            let mut call = ScriptCall::new(&scripts::LEAVE, 1);
            call.key(&queue).arg(&inner.service_id);
            if let Err(e) = inner.backend.run::<i64>("leave", &call).await {
                tracing::debug!(error = %e, "could not deregister a waiting service");
            }
        })
    }

    /// Leaves the line and, when this service stops waiting, deregisters it before returning:
    /// a caller that gave up is not offered the next turn after it returned.
    async fn leave_now(mut self) {
        if let Some(deregister) = self.leave() {
            deregister.await;
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(deregister) = self.leave() {
            self.inner.runtime.spawn(deregister);
        }
    }
}

/// Sleeps until woken, `hint` elapsed (the lock's remaining lease) or the deadline.
async fn wait_for(wake: &Notify, hint: Option<Duration>, deadline: Option<Instant>) {
    let now = Instant::now();
    let until = match (hint.map(|h| now + h), deadline) {
        (Some(h), Some(d)) => Some(h.min(d)),
        (h, d) => h.or(d),
    };
    match until {
        Some(until) => {
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep_until(until.into()) => {}
            }
        }
        None => wake.notified().await,
    }
}

fn replica_sync_error(inner: &Inner, names: &KeyNames) -> LockError {
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

fn parse_attempt(reply: &[i64; 3], names: &KeyNames) -> Result<Attempt, LockError> {
    match reply {
        [1, token_value, _] => Ok(Attempt::Granted(token(*token_value))),
        [2, token_value, _grants] => Ok(Attempt::Holding(token(*token_value))),
        [0, ttl, _] => Ok(Attempt::Held(if *ttl >= 0 {
            Duration::from_millis(*ttl as u64)
        } else {
            // no expiry (set by someone else) or just gone: look again soon
            Duration::from_millis(100)
        })),
        _ => Err(bad_reply("acquire", names, reply)),
    }
}

fn parse_released(reply: &[i64; 3], names: &KeyNames) -> Result<Released, LockError> {
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
            matches!(parse_attempt(&[0, 50, 0], &n), Ok(Attempt::Held(d)) if d.as_millis() == 50)
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
