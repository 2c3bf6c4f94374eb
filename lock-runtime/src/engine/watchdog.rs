//! The watchdog: one task per service renews every lock held without a lease, in batches, every
//! third of `watchdog_timeout`, and tells guards when their lock is gone.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::cluster_routing::Slot;

use super::core::Engine;
use super::local::Renewal;
use crate::scripts::ScriptCall;

/// Locks renewed or extended per script call (one round trip each; few enough that one call
/// keeps Redis busy for a short while only).
pub(crate) const BATCH: usize = 256;

/// Renews until the service is dropped or shuts down; idle wake-up subscriptions are dropped on the way, and
/// holds whose validity deadline passed unnoticed are reported lost.
pub(crate) async fn run(inner: Weak<Engine>, period: Duration) {
    let Some(closing) = inner.upgrade().map(|inner| inner.closing.clone()) else {
        return;
    };
    let start = tokio::time::Instant::now();
    let mut renew = tokio::time::interval_at(start + period, period);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let sweep_period = Duration::from_secs(1).min(period);
    let mut sweep = tokio::time::interval_at(start + sweep_period, sweep_period);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = closing.cancelled() => return,
            _ = renew.tick() => {
                let Some(inner) = inner.upgrade() else { return };
                renew_all(&inner).await;
            }
            _ = sweep.tick() => {
                let Some(inner) = inner.upgrade() else { return };
                inner.local.report_expired();
                inner.unsubscribe_idle().await;
            }
        }
    }
}

async fn renew_all(inner: &Arc<Engine>) {
    let lease_ms = u64::try_from(inner.config.watchdog_timeout().as_millis()).unwrap_or(u64::MAX);
    let due = inner.local.renewals();
    // one script call renews holds of one kind (its script), and in cluster mode of one slot
    let cluster = inner.backend.is_cluster();
    let mut groups: HashMap<(usize, Option<Slot>), Vec<Renewal>> = HashMap::new();
    for r in due {
        let slot = cluster.then(|| Slot::for_key(&*r.key));
        groups.entry((r.kind.id, slot)).or_default().push(r);
    }
    for batch in groups.values().flat_map(|group| group.chunks(BATCH)) {
        let mut call = ScriptCall::new(batch[0].kind.renew, batch.len());
        for r in batch {
            call.key(&r.key);
        }
        call.arg(lease_ms).arg("r");
        for r in batch {
            call.arg(&*r.owner).arg(&*r.grant);
        }
        let sent = std::time::Instant::now();
        match inner.backend.run::<Vec<i64>>("renew", &call).await {
            Ok(flags) if flags.len() == batch.len() => {
                for (r, flag) in batch.iter().zip(flags) {
                    match flag {
                        1 => {
                            inner.local.renewed(&r.key, &r.grant, sent, lease_ms, true);
                            if let Some(info) = r.cell.info() {
                                info.renewed();
                            }
                        }
                        // lost: reported (logged, counted, sent) with the grant dropped
                        0 => inner.local.renewed(&r.key, &r.grant, sent, lease_ms, false),
                        // not renewed; its validity deadline tells the guards if it stays so
                        _ => {
                            tracing::warn!(key = %r.key, owner = %r.owner, "lock renewal failed for this key; retrying");
                            if let Some(info) = r.cell.info() {
                                info.renewal_failed(&"the renew script failed for this key");
                            }
                        }
                    }
                }
            }
            Ok(flags) => {
                tracing::warn!(?flags, "unexpected reply from the renew script");
                for info in batch.iter().filter_map(|r| r.cell.info()) {
                    info.renewal_failed(&"unexpected reply from the renew script");
                }
            }
            // the guards learn of a lock that stays unrenewed from its validity deadline
            Err(e) => {
                tracing::warn!(error = %e, locks = batch.len(), "lock renewal failed; retrying");
                for info in batch.iter().filter_map(|r| r.cell.info()) {
                    info.renewal_failed(&e);
                }
            }
        }
    }
}
