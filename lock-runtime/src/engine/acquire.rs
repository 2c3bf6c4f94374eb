//! Acquiring: re-entry, the waiter line, attempts on Redis, waiting for a wake-up or hand-off,
//! and giving back what a caller that left was granted.

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::Script;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::batcher::Op;
use super::core::{Engine, replica_sync_error};
use super::guard::Guard;
use super::ids::{GrantId, OwnerField, new_grant_id};
use super::line::Turn;
use super::reply::{Ask, Attempt, parse_attempt};
use super::target::Target;
use crate::detach::Detachable;
use crate::error::{ErrorKind, LockError};
use crate::metrics::{self, How, Outcome};
use crate::owner::{OwnerId, Site};
use crate::scripts::{self, ScriptCall};

impl Engine {
    /// Acquires `target` for `owner`, waiting up to `wait` (`None`: until acquired), for a
    /// lock call made at `site` (see [`CallSite`]): a call that would wait for a guard a call
    /// from the same site holds is refused (`WouldDeadlock`), and the guard keeps `site`.
    ///
    /// (A function returning the future rather than an `async fn`: an `async fn` keeps its
    /// arguments twice, and every lock call's future carries this one.)
    pub(crate) fn acquire(
        self: Arc<Self>,
        target: Target,
        owner: OwnerId,
        lease: Option<Duration>,
        wait: Option<Duration>,
        site: CallSite,
    ) -> impl Future<Output = Result<Guard, LockError>> + Send + 'static {
        let span = tracing::info_span!(
            "lock.acquire",
            kind = target.kind.noun,
            key = %target.names.user,
            owner = %owner,
            fence = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        );
        async move {
            let site = match site {
                // where this call is made (awaited): a guard it gets keeps it
                CallSite::Polled => crate::owner::site().map(Arc::new),
                CallSite::Known(site) => site,
            };
            let started = Instant::now();
            // a wait too long to count in an Instant is forever
            let deadline = wait.and_then(|w| started.checked_add(w));
            let mut path = Path::default();
            let granted = self
                .acquire_inner(
                    &target,
                    owner,
                    lease,
                    deadline,
                    wait.unwrap_or(Duration::MAX),
                    site.as_deref(),
                    &mut path,
                    started,
                )
                .instrument(span.clone())
                .await;
            // A grant that arrived while the service began to shut down (after its holds were
            // released) is given back, not handed out (boxed: a rare path, kept out of every
            // acquire's size).
            let closing = self.is_closing();
            let result = match granted {
                Ok(mut guard) => {
                    if closing {
                        let given_back =
                            Self::give_back_closing(guard, &target, &span, started, &path);
                        return Box::pin(given_back).await;
                    }
                    guard.mark_site(site);
                    Ok(guard)
                }
                failed => failed,
            };
            Self::acquired(&target, &span, started, &path, result)
        }
    }

    /// Gives back `guard`, whose grant arrived while the service began to shut down;
    /// the lock call fails with the shutdown error.
    async fn give_back_closing(
        guard: Guard,
        target: &Target,
        span: &tracing::Span,
        started: Instant,
        path: &Path,
    ) -> Result<Guard, LockError> {
        if let Err(e) = guard.release().await {
            tracing::debug!(parent: span, error = %e, "giving back a grant at shutdown failed");
        }
        let closing = Self::closing_error(target.kind, &target.names);
        Self::acquired(target, span, started, path, Err(closing))
    }

    /// Records how an acquire that started at `started` went (its span's fields, a debug
    /// event, its metrics) and returns its result.
    fn acquired(
        target: &Target,
        span: &tracing::Span,
        started: Instant,
        path: &Path,
        result: Result<Guard, LockError>,
    ) -> Result<Guard, LockError> {
        let took = started.elapsed();
        span.record("waited_ms", took.as_millis() as u64);
        let outcome = match &result {
            Ok(guard) => {
                span.record("fence", guard.fence());
                let how = match path.how {
                    How::Attempt => "granted",
                    How::HandOff => "handed off",
                    How::Reentry => "re-entered",
                };
                tracing::debug!(parent: span, fence = guard.fence(), waited_ms = took.as_millis() as u64, how, "lock acquired");
                Outcome::Granted
            }
            Err(e) if e.kind() == ErrorKind::Timeout => Outcome::TimedOut,
            Err(_) => Outcome::Error,
        };
        let how = result.is_ok().then_some(path.how);
        let (kind, label) = (target.kind.mode, target.label);
        metrics::acquired(kind, label, outcome, how, took, path.waited);
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn acquire_inner(
        self: &Arc<Self>,
        target: &Target,
        owner: OwnerId,
        lease: Option<Duration>,
        deadline: Option<Instant>,
        wait: Duration,
        site: Option<&Site>,
        path: &mut Path,
        started: Instant,
    ) -> Result<Guard, LockError> {
        let names = &target.names;
        let kind = target.kind;
        if self.is_closing() {
            return Err(Self::closing_error(kind, names));
        }
        let field = self.owner_field(&owner);
        let lease_ms = Self::millis(lease.unwrap_or(self.config.watchdog_timeout()));
        let watched = lease.is_none();
        let guard = |inner: &Arc<Self>, token, grant: &GrantId, cell| {
            Guard::new(
                inner.clone(),
                target.clone(),
                owner.clone(),
                field.clone(),
                grant.clone(),
                token,
                lease,
                cell,
            )
        };

        // A hold of this service that a guard of a call made at the same site keeps: that
        // guard goes only after this call returns, so waiting for it could never end.
        let waits_for_itself = || {
            wait > Duration::ZERO
                && site
                    .is_some_and(|site| self.local.held_at(&names.lock, &field, kind.shared, site))
        };

        // The uncontended case: this service has nothing of the key (no hold: nothing to
        // re-enter, nothing to wait for at this site), and the call joins its line at once,
        // its first turn in hand.
        let grant = new_grant_id();
        let join = |only_if_clear, now| {
            let joined = self.local.enqueue(
                &names.lock,
                kind,
                &field,
                &grant,
                &target.extra,
                lease_ms,
                watched,
                only_if_clear,
                now,
            );
            joined.map(|(id, wake, turn)| (id, wake, turn, now))
        };
        let joined = join(true, started);
        let (id, wake, first_turn, joined_at) = match joined {
            Some(joined) => joined,
            None => {
                // Re-entry: the owner holds the key here already, so it must not queue behind
                // waiters that wait for it. Redis confirms that grant (and extends it to this
                // lease); if it is gone, its guards are lost and this call waits for a new
                // grant like any other.
                let holding = kind
                    .reentrant
                    .then(|| self.local.holding(&names.lock, &field, kind.shared))
                    .flatten();
                if let Some(grant) = holding {
                    let sent = Instant::now();
                    match self
                        .attempt(target, &field, &grant, lease_ms, Ask::Confirm)
                        .await?
                    {
                        Attempt::Granted(token) | Attempt::Holding(token) => {
                            if let Some(cell) =
                                self.local
                                    .add_guard(&names.lock, &grant, watched, sent, lease_ms)
                            {
                                path.how = How::Reentry;
                                return Ok(guard(self, token, &grant, cell));
                            }
                        }
                        Attempt::Held { .. } => self.local.drop_grant(&names.lock, &grant),
                    }
                }

                // An owner that holds the key in another mode (a writer taking a read share)
                // does not queue behind waiters that wait for its own hold: it asks once, at
                // once.
                if kind.reentrant && self.local.holds_any(&names.lock, &field) {
                    let grant = new_grant_id();
                    let sent = Instant::now();
                    let ask = Ask::Grant {
                        horizon_ms: 0,
                        fresh: self.registered.fresh(&names.lock),
                    };
                    if let Attempt::Granted(token) | Attempt::Holding(token) =
                        self.attempt(target, &field, &grant, lease_ms, ask).await?
                    {
                        let cell = self.local.add_new_hold(
                            &names.lock,
                            kind,
                            &field,
                            &grant,
                            watched,
                            sent,
                            lease_ms,
                        );
                        return Ok(guard(self, token, &grant, cell));
                    }
                }

                if waits_for_itself() {
                    return Err(Self::would_deadlock_error(kind, names));
                }
                join(false, Instant::now()).expect("joins when not only if clear")
            }
        };
        let mut first_turn = Some((first_turn, joined_at));
        let mut ticket = Ticket {
            inner: self,
            target,
            id,
            done: false,
        };
        let _waiting = metrics::Waiting::new(kind.mode, target.label);
        let mut subscribed = false;
        loop {
            if self.is_closing() {
                // a hand-off that reached this waiter meanwhile is given back by leaving
                ticket.leave_now().await;
                return Err(Self::closing_error(kind, names));
            }
            let mut hint = None;
            // (the first turn was found when the call joined the line: an attempt it makes
            // counts its lease from then, before it is sent; later turns, from when it is sent)
            let (turn, found_at) = match first_turn.take() {
                Some((turn, at)) => (turn, Some(at)),
                None => (self.local.turn(&names.lock, id), None),
            };
            match turn {
                Turn::Granted {
                    token,
                    since,
                    claim,
                } => {
                    ticket.done = true;
                    path.how = How::HandOff;
                    let (cell, registered) = self.local.leave_granted(&names.lock, id, since);
                    self.leave_after_grant(target, registered);
                    if claim {
                        self.claim_later(target, &field, &grant, since, lease_ms, watched);
                    }
                    return Ok(guard(self, token, &grant, cell));
                }
                Turn::Wait => {}
                Turn::Behind { until } => {
                    // the hold came while this call waited (a concurrent child at its site)
                    if waits_for_itself() {
                        ticket.leave_now().await;
                        return Err(Self::would_deadlock_error(kind, names));
                    }
                    hint = Some(
                        until.saturating_duration_since(Instant::now()) + Duration::from_millis(1),
                    );
                }
                Turn::Attempt => {
                    let sent = found_at.unwrap_or_else(Instant::now);
                    let horizon_ms = self.waiter_horizon(deadline, sent);
                    let fresh = self.registered.fresh(&names.lock);
                    let ask = Ask::Grant { horizon_ms, fresh };
                    let attempt = self.attempt(target, &field, &grant, lease_ms, ask).await;
                    if !matches!(attempt, Ok(Attempt::Granted(_) | Attempt::Holding(_))) {
                        // refused, which registered this service as waiting, or an outcome
                        // not known, which may have
                        let horizon = Duration::from_millis(horizon_ms);
                        self.registered.note(&names.lock, sent, horizon);
                    }
                    match attempt? {
                        Attempt::Granted(token) | Attempt::Holding(token) => {
                            ticket.done = true;
                            let (cell, registered) =
                                self.local.leave_granted(&names.lock, id, sent);
                            self.leave_after_grant(target, registered);
                            return Ok(guard(self, token, &grant, cell));
                        }
                        Attempt::Held { retry: ttl, room } => {
                            self.local.park(&names.lock, id, room);
                            let out_of_time = deadline.is_some_and(|d| Instant::now() >= d);
                            if !subscribed && !out_of_time {
                                subscribed = true;
                                // Subscribe, then try again: a release between the failed
                                // attempt and the subscription would otherwise go unnoticed.
                                // Already subscribed (another waiter of this service), the
                                // release's message wakes this head: no second attempt.
                                // (boxed: once per waiting call, kept out of every acquire's size)
                                if Box::pin(self.ensure_subscribed(&names.channel())).await? {
                                    self.local.may_be_free(&names.lock);
                                    continue;
                                }
                            }
                            let jitter = rand::rng().random_range(1..=20);
                            // Look again before this service's registration as waiting runs
                            // out (a second before it): a release after that would not wake it.
                            let registered =
                                Duration::from_millis(horizon_ms.saturating_sub(1_000));
                            let ttl = if horizon_ms > 0 {
                                ttl.min(registered)
                            } else {
                                ttl
                            };
                            let look = ttl + Duration::from_millis(jitter);
                            hint = Some(look);
                            if kind.shared && kind.hand_off && !room {
                                // the waiters of this service wait for a hand-off or a
                                // wake-up, not for attempts of their own in vain
                                self.local.quiet(&names.lock, sent, Instant::now() + look);
                            }
                        }
                    }
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                ticket.leave_now().await;
                return Err(self.timeout_error(kind, names, wait));
            }
            path.waited = true;
            wait_for(&wake, &self.closing, hint, deadline).await;
        }
    }

    /// One acquire (`acquire.lua`) with the grant id `grant`. The call completes even if the
    /// caller goes away. A grant nobody will use is given back: one that arrives after the
    /// caller left, and - for [`Ask::Grant`] - any call whose outcome is unknown (it failed or
    /// timed out, whether or not the caller still waits), since Redis may run it later. The
    /// give-back releases that grant id only, so it never frees a hold that was already there.
    /// A refusal that arrives after the caller left registered the service as waiting, maybe
    /// after its line's deregistration ran: it deregisters again unless someone of it waits.
    async fn attempt(
        self: &Arc<Self>,
        target: &Target,
        field: &OwnerField,
        grant: &GrantId,
        lease_ms: u64,
        ask: Ask,
    ) -> Result<Attempt, LockError> {
        let (inner, t, f, g) = (self.clone(), target.clone(), field.clone(), grant.clone());
        let call = async move { inner.run_acquire(&t, &f, &g, lease_ms, ask).await };
        let (inner, n, f, g) = (self.clone(), target.clone(), field.clone(), grant.clone());
        let orphan = move |reply: Result<Attempt, LockError>| {
            let give_back = match &reply {
                Ok(Attempt::Granted(_) | Attempt::Holding(_)) => ask != Ask::Confirm,
                Err(_) => ask != Ask::Confirm,
                Ok(Attempt::Held { .. }) => false,
            };
            if give_back {
                tracing::debug!(key = %n.names.user, ?reply, "acquire cancelled, giving the grant back");
                inner.give_back(n, f, g);
            } else if matches!(ask, Ask::Grant { horizon_ms, .. } if horizon_ms > 0) {
                inner.leave_unless_waiting(&n);
            }
        };
        let reply = Detachable::new(&self.runtime, call, orphan).await;
        if let Err(e) = &reply
            && ask != Ask::Confirm
        {
            tracing::debug!(key = %target.names.user, error = %e, "acquire failed; giving back whatever it may have granted");
            self.give_back(target.clone(), field.clone(), grant.clone());
        }
        reply
    }

    /// After a grant that emptied a line while the service may still be registered as waiting
    /// (`registered`, see [`Local::leave_granted`](super::local::Local::leave_granted)):
    /// deregisters the service in the background, unless the kind's grant did.
    fn leave_after_grant(self: &Arc<Self>, target: &Target, registered: bool) {
        if registered && !target.kind.leaves_on_grant {
            self.runtime.spawn(self.deregister(target, None, true));
        }
    }

    /// Deregisters the service as waiting for `target`'s lock, in the background, when nobody
    /// of it waits for it (any more), or none of its waiters of the kind does.
    fn leave_unless_waiting(self: &Arc<Self>, target: &Target) {
        let line_empty = !self.local.has_waiters(&target.names.lock);
        if let Some(deregister) = self.deregistration(target, line_empty) {
            self.runtime.spawn(deregister);
        }
    }

    /// The deregistration due once a waiter of `target`'s kind left the line (`line_empty`:
    /// nobody of this service waits for the lock any more): the kind's own `leave` when none
    /// of its waiters of the kind is left, and `leave.lua` when the line is empty; `None` when
    /// neither is due.
    fn deregistration(
        self: &Arc<Self>,
        target: &Target,
        line_empty: bool,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let kind_leave = target
            .kind
            .leave
            .filter(|_| self.local.waiters_of(&target.names.lock, target.kind) == 0);
        (line_empty || kind_leave.is_some())
            .then(|| self.deregister(target, kind_leave, line_empty))
    }

    /// The calls that deregister this service as waiting for `target`'s lock once nobody of it
    /// waits: the kind's own `leave` (`kind_leave`: its last waiter of the kind left), then,
    /// when `line_empty`, `leave.lua` (which deletes a mutex's waiting heads with the last
    /// registration). A caller of this service that joined the line since may
    /// have registered before the removal reached Redis: the head of the line is woken then,
    /// to look again and so register anew (a release elsewhere would not wake it otherwise).
    fn deregister(
        self: &Arc<Self>,
        target: &Target,
        kind_leave: Option<&'static LazyLock<Script>>,
        line_empty: bool,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (inner, names) = (self.clone(), target.names.clone());
        let kind_heads = target
            .kind
            .fourth_key
            .filter(|suffix| *suffix == scripts::HEADS_SUFFIX);
        async move {
            if let Some(script) = kind_leave {
                let mut call = ScriptCall::new(script, 2);
                call.key(&names.turn())
                    .key(&names.queue())
                    .arg(&inner.service_id)
                    .arg(names.channel())
                    .arg(inner.backend.publish_command());
                if let Err(e) = inner.backend.run::<i64>("leave", &call).await {
                    tracing::debug!(error = %e, "could not deregister a waiting service");
                }
            }
            if line_empty {
                let heads = kind_heads.map(|suffix| names.suffixed(suffix));
                let mut call = ScriptCall::new(&scripts::LEAVE, 1 + usize::from(heads.is_some()));
                call.key(&names.queue());
                if let Some(heads) = &heads {
                    call.key(heads);
                }
                call.arg(&inner.service_id);
                if let Err(e) = inner.backend.run::<i64>("leave", &call).await {
                    tracing::debug!(error = %e, "could not deregister a waiting service");
                }
                inner.local.wake_head(&names.lock);
            }
        }
    }

    async fn run_acquire(
        self: &Arc<Self>,
        target: &Target,
        field: &OwnerField,
        grant: &GrantId,
        lease_ms: u64,
        ask: Ask,
    ) -> Result<Attempt, LockError> {
        let names = &target.names;
        let synced = self
            .run_op(Op::Acquire {
                target: target.clone(),
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
                self.give_back(target.clone(), field.clone(), grant.clone());
                Err(replica_sync_error(self, names))
            }
            attempt => Ok(attempt),
        }
    }
}

/// Where a lock call is made, for [`Engine::acquire`].
pub(crate) enum CallSite {
    /// Wherever the acquire is first polled (the task that awaits it).
    Polled,
    /// Known already (`None`: outside a tokio runtime).
    Known(Option<Arc<Site>>),
}

/// How an acquire went, for its metrics.
#[derive(Debug)]
struct Path {
    how: How,
    /// It found the lock busy and waited.
    waited: bool,
}

impl Default for Path {
    fn default() -> Self {
        Path {
            how: How::Attempt,
            waited: false,
        }
    }
}

/// A place in a waiter line; leaving it (drop) gives back a hand-off that already arrived.
struct Ticket<'a> {
    inner: &'a Arc<Engine>,
    target: &'a Target,
    id: u64,
    done: bool,
}

impl Ticket<'_> {
    /// Leaves the line; when nobody of this service waits any more, deregisters the service as
    /// waiting so that releases elsewhere do not give it a turn, after the kind's own `leave`
    /// when this was its last waiter of the kind. Returns the deregistration calls when due, to
    /// await or spawn.
    fn leave(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        self.done = true;
        let names = &self.target.names;
        let (orphan, line_empty) = self.inner.local.leave(&names.lock, self.id);
        if let Some(orphan) = orphan {
            self.inner
                .give_back(self.target.clone(), orphan.owner, orphan.grant);
            return None;
        }
        self.inner.deregistration(self.target, line_empty)
    }

    /// Leaves the line and, when this service stops waiting, deregisters it before returning:
    /// a caller that gave up is not offered the next turn after it returned.
    async fn leave_now(mut self) {
        // boxed: a call that waits carries a pointer to it, not its size
        let deregister = self.leave().map(Box::pin);
        if let Some(deregister) = deregister {
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

/// Sleeps until woken, `hint` elapsed (the lock's remaining lease), the deadline or the
/// service shuts down.
async fn wait_for(
    wake: &Notify,
    closing: &CancellationToken,
    hint: Option<Duration>,
    deadline: Option<Instant>,
) {
    let now = Instant::now();
    let until = match (hint.map(|h| now + h), deadline) {
        (Some(h), Some(d)) => Some(h.min(d)),
        (h, d) => h.or(d),
    };
    match until {
        Some(until) => {
            tokio::select! {
                () = wake.notified() => {}
                () = closing.cancelled() => {}
                () = tokio::time::sleep_until(until.into()) => {}
            }
        }
        None => {
            tokio::select! {
                () = wake.notified() => {}
                () = closing.cancelled() => {}
            }
        }
    }
}
