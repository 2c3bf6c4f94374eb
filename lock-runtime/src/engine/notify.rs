//! Wake-ups: the shared subscriber's pushes are routed to the head waiter of the lock they name.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use rand::Rng;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::core::Engine;
use super::push::{Pushed, addressee};
use crate::backend::PushSink;
use crate::scripts::{CHANNEL_SUFFIX, TURN_MS};

/// Routes pushes until the service is dropped or shuts down.
pub(crate) async fn run(inner: Weak<Engine>, mut pushes: UnboundedReceiver<PushInfo>) {
    let Some(closing) = inner.upgrade().map(|inner| inner.closing.clone()) else {
        return;
    };
    // After the subscriber's client lost a connection that it restores by itself (see
    // `Backend::restores_subscriptions`): when, the channels whose subscription it restored
    // since, and when to subscribe the others ourselves.
    let mut restoring = Restoring::default();
    loop {
        let push = tokio::select! {
            () = closing.cancelled() => return,
            push = pushes.recv() => push,
            () = sleep_until(restoring.check), if restoring.check.is_some() => {
                restoring.check = None;
                let Some(inner) = inner.upgrade() else { return };
                // A client that has not learnt of a failover yet has nothing to restore on:
                // subscribe the channels it did not restore ourselves, as after any other loss.
                if !inner.resubscribing.swap(true, Ordering::SeqCst) {
                    let restored = std::mem::take(&mut restoring.channels);
                    inner.runtime.spawn(resubscribe(Arc::downgrade(&inner), restored));
                }
                continue;
            }
        };
        let Some(push) = push else { return };
        let Some(inner) = inner.upgrade() else { return };
        match push.kind {
            // (only those that came before the service was set up: see `sink`)
            PushKind::Message | PushKind::SMessage => route_message(&inner, &push),
            // Messages published while disconnected are lost, and the subscriptions may be
            // too (a client that gave up reconnecting resubscribes only when it is used again):
            // subscribe again to every channel someone waits on, then every head looks again.
            // The cluster client subscribes its new connection by itself (see
            // `Backend::restores_subscriptions`); each head looks again once its channel's
            // subscription is back (below).
            PushKind::Disconnection => {
                inner.local.wake_all_heads();
                if inner.backend.restores_subscriptions() {
                    restoring = Restoring {
                        since: Some(Instant::now()),
                        channels: HashSet::new(),
                        check: Some(tokio::time::Instant::now() + RESTORE_GRACE),
                    };
                } else if !inner.resubscribing.swap(true, Ordering::SeqCst) {
                    inner
                        .runtime
                        .spawn(resubscribe(Arc::downgrade(&inner), HashSet::new()));
                }
            }
            // A subscription the client restored after a reconnection: a release published
            // before it was back was missed.
            PushKind::SSubscribe | PushKind::Subscribe
                if restoring.since.is_some_and(|at| at.elapsed() < RESTORING) =>
            {
                if let Some(key) = push.data.first().and_then(lock_key_of_channel) {
                    inner.local.wake_head(key);
                    restoring.channels.insert(format!("{key}{CHANNEL_SUFFIX}"));
                }
            }
            // A subscription ended that someone here still waits on: not one of this
            // service's own unsubscriptions (those are of channels nobody waited on), but the
            // server's - in a cluster, the master that gives a slot up drops the shard channels
            // of that slot. Subscribe again (on the slot's new owner) and look again.
            PushKind::Unsubscribe | PushKind::SUnsubscribe => {
                let waited = push
                    .data
                    .first()
                    .and_then(lock_key_of_channel)
                    .is_some_and(|key| inner.local.has_waiters(key));
                if waited && !inner.resubscribing.swap(true, Ordering::SeqCst) {
                    tracing::debug!("the server dropped a wake-up subscription; subscribing again");
                    inner
                        .runtime
                        .spawn(resubscribe(Arc::downgrade(&inner), HashSet::new()));
                }
            }
            _ => {}
        }
    }
}

/// The pushes of the service's connections: wake-up messages are routed at once, by the
/// connection that read them (no task in between: a wake-up is one hop shorter); everything
/// else - subscriptions, disconnections - goes in order to [`run`] through `rest`, and so do
/// messages that come before `engine` is set.
pub(crate) fn sink(
    engine: Arc<OnceLock<Weak<Engine>>>,
    rest: UnboundedSender<PushInfo>,
) -> PushSink {
    Arc::new(move |push: PushInfo| {
        if matches!(push.kind, PushKind::Message | PushKind::SMessage)
            && let Some(inner) = engine.get().and_then(Weak::upgrade)
        {
            route_message(&inner, &push);
            return;
        }
        // the receiver is gone only when the service is
        let _ = rest.send(push);
    })
}

/// Routes a wake-up message to the head waiter of the lock it names.
fn route_message(inner: &Arc<Engine>, push: &PushInfo) {
    let Some(key) = push.data.first().and_then(lock_key_of_channel) else {
        return;
    };
    // The payload names the service whose turn it is ("0": anyone's), or the service whose
    // head waiter a release granted the lock to, and the grant.
    let ours = match push.data.get(1) {
        Some(Value::BulkString(message)) => {
            if let Some(pushed) = Pushed::parse(message, &inner.service_id) {
                inner.deliver_push(key, pushed);
                return;
            }
            let who = addressee(message);
            who == b"0" || who == inner.service_id.as_bytes()
        }
        _ => true,
    };
    if ours {
        inner.local.wake_head(key);
    } else {
        // Another service's turn. If that service went away, nobody claims it and it runs
        // out: look again then, rather than sleeping through the rest of the released lock's
        // lease.
        inner.watch_turn(key);
    }
}

/// How long after a lost connection a subscription's confirmation is taken for the client's
/// restoration of it (and wakes the channel's head): the client reconnects within a few
/// backoff steps; a head woken by a later confirmation of its own first subscription only
/// asks Redis once more.
const RESTORING: Duration = Duration::from_secs(10);

/// How long a client that restores its subscriptions itself is given to do so before the
/// service subscribes the channels it did not restore: a reconnection to the same node takes a
/// few milliseconds; after a failover the client may not know the new master until a command
/// of its own is refused, and the subscriber sends none.
const RESTORE_GRACE: Duration = Duration::from_secs(1);

/// What the pushes told of a restoration of subscriptions under way (see [`run`]).
#[derive(Default)]
struct Restoring {
    /// When the connection was lost.
    since: Option<Instant>,
    /// The channels whose subscription the client confirmed since.
    channels: HashSet<String>,
    /// When to subscribe the others.
    check: Option<tokio::time::Instant>,
}

/// Sleeps until `at` (forever for `None`; the caller does not poll it then).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Subscribes again to the channels this service's waiters wait on, until Redis takes the
/// subscriptions (or nobody waits any more), then wakes every head waiter: a release published
/// while the subscriptions were gone was missed. The channels in `restored` are subscribed
/// already (the client restored them): they are not sent again.
async fn resubscribe(inner: Weak<Engine>, restored: HashSet<String>) {
    let mut pause = Duration::from_millis(20);
    loop {
        let Some(service) = inner.upgrade() else {
            return;
        };
        let channels: Vec<String> = {
            let mut subscribed = service.subscriptions.lock().await;
            subscribed.retain(|channel| restored.contains(channel));
            service
                .local
                .waited_keys()
                .into_iter()
                .map(|key| format!("{key}{CHANNEL_SUFFIX}"))
                .collect()
        };
        let mut failed = None;
        for channel in &channels {
            if let Err(e) = service.ensure_subscribed(channel).await {
                failed = Some(e);
                break;
            }
        }
        match failed {
            None => {
                service.resubscribing.store(false, Ordering::SeqCst);
                service.local.wake_all_heads();
                tracing::debug!(channels = channels.len(), "wake-up subscriptions restored");
                return;
            }
            Some(e) => {
                tracing::debug!(error = %e, "resubscribing failed; trying again");
                drop(service);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}

impl Engine {
    /// The next turn of `key` went to another service: unless a timer already watches `key`,
    /// start one that wakes the head once that turn can have run out unclaimed (a turn lasts
    /// `TURN_MS`; a little jitter keeps the services that wait apart).
    pub(crate) fn watch_turn(self: &Arc<Self>, key: &str) {
        if !self.local.watch_turn(key) {
            return;
        }
        let (weak, key) = (Arc::downgrade(self), key.to_owned());
        let turn = Duration::from_millis(TURN_MS)
            + Duration::from_millis(rand::rng().random_range(1..=50));
        self.runtime.spawn(async move {
            tokio::time::sleep(turn).await;
            if let Some(inner) = weak.upgrade() {
                inner.local.turn_watch_fired(&key);
            }
        });
    }
}

fn lock_key_of_channel(channel: &Value) -> Option<&str> {
    match channel {
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()?
            .strip_suffix(CHANNEL_SUFFIX),
        Value::SimpleString(s) => s.strip_suffix(CHANNEL_SUFFIX),
        _ => None,
    }
}
