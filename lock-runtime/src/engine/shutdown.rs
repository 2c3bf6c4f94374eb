//! The graceful end of a service: no new acquires, waits end, every hold of the service is
//! released on Redis (batched), the watchdog and the subscriber stop.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redis::cluster_routing::Slot;

use super::batcher::Op;
use super::core::Engine;
use super::kind::Kind;
use super::local::Ended;
use super::names::KeyNames;
use super::target::Target;
use crate::error::{ErrorKind, LockError};

/// Operations in one release call at most (as the batcher's calls).
const BATCH: usize = 128;

impl Engine {
    /// Whether the service shuts down (or did).
    pub(crate) fn is_closing(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The error of an acquire refused (or a wait ended) because the service shuts down.
    pub(crate) fn closing_error(kind: &Kind, names: &KeyNames) -> LockError {
        LockError::new(
            ErrorKind::ShuttingDown,
            format!(
                "{} `{}` was not acquired: the lock service is shutting down",
                kind.noun, names.user
            ),
        )
        .with_key(&names.user)
    }

    /// Shuts the service down (see [`LockService::shutdown`](crate::LockService::shutdown));
    /// a second call returns at once.
    pub(crate) async fn shut_down(self: &Arc<Self>) -> Result<(), LockError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // from here acquires are refused, waits end, the watchdog and the subscriber stop
        self.closing.cancel();
        let ended = self.local.shut_down();
        let count = ended.len();
        let timeout = self.config.response_timeout();
        let released = tokio::time::timeout(timeout, async {
            let released = self.release_ended(ended).await;
            // releases that began before the shutdown (a guard dropped a moment before) end
            // before it returns: the process may exit right after
            self.releasing.idle().await;
            released
        })
        .await;
        let subscriptions = tokio::time::timeout(timeout, self.unsubscribe_all()).await;
        if let Ok(Err(e)) = subscriptions {
            tracing::debug!(error = %e, "unsubscribing at shutdown failed");
        }
        match released {
            Ok(Ok(())) => {
                tracing::debug!(
                    locks = count,
                    "lock service shut down; its locks are released"
                );
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LockError::new(
                ErrorKind::Backend,
                format!(
                    "the lock service shut down, but Redis did not confirm the release of its \
                     {count} lock(s) within {timeout:?} (redis.response_timeout); those not \
                     released expire with their leases"
                ),
            )),
        }
    }

    /// Releases the grants of `ended` on Redis: one script call per kind (and cluster slot),
    /// all calls at once; the first error, after all of them ran.
    async fn release_ended(self: &Arc<Self>, ended: Vec<Ended>) -> Result<(), LockError> {
        let cluster = self.backend.is_cluster();
        let prefix = self.config.prefix();
        let mut groups: HashMap<(usize, Option<Slot>), Vec<Op>> = HashMap::new();
        for e in ended {
            let slot = cluster.then(|| Slot::for_key(&*e.key));
            let target = Target::new(e.kind, KeyNames::of_lock_key(prefix, e.key));
            groups
                .entry((e.kind.id, slot))
                .or_default()
                .push(Op::Release {
                    target,
                    owner: e.owner,
                    grant: e.grant,
                    next: None,
                    in_turn: false,
                    keep_until: None,
                });
        }
        let mut calls = tokio::task::JoinSet::new();
        for mut group in groups.into_values() {
            while !group.is_empty() {
                let rest = group.split_off(group.len().min(BATCH));
                let inner = self.clone();
                calls.spawn(async move { inner.send_ops(&group).await });
                group = rest;
            }
        }
        let mut first = Ok(());
        while let Some(replies) = calls.join_next().await {
            let replies = replies.map_err(|e| {
                LockError::new(ErrorKind::Backend, format!("a release call stopped: {e}"))
            })?;
            for reply in replies {
                if let Err(e) = reply {
                    first = first.and(Err(e));
                }
            }
        }
        first
    }

    /// Unsubscribes from every wake-up channel (nobody here waits any more).
    async fn unsubscribe_all(&self) -> Result<(), LockError> {
        let mut subscribed = self.subscriptions.lock().await;
        let all: Vec<String> = subscribed.drain().collect();
        if all.is_empty() {
            return Ok(());
        }
        self.backend.unsubscribe(&all).await
    }
}
