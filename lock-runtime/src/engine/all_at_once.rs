//! The fast path of a multi-key lock: every target tried at once, without waiting, in as few
//! script calls as it takes; what was granted after the first refusal is given back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::batcher::Op;
use super::core::Engine;
use super::guard::Guard;
use super::ids::{GrantId, OwnerField, new_grant_id};
use super::reply::{Ask, Attempt, parse_attempt};
use super::target::Target;
use crate::detach::Detachable;
use crate::metrics::{self, How, Outcome};
use crate::owner::OwnerId;

impl Engine {
    /// Tries every target at once, without waiting, in the order given, in as few script calls
    /// as it takes (at most [`MAX_OPS`](super::batcher::MAX_OPS) targets each, see
    /// [`send_ops`](Self::send_ops)): the fast path of a multi-key lock whose keys live on one
    /// node (one slot in cluster mode).
    /// Returns the guards of the targets granted before the first refusal (all of them when
    /// none was refused); every grant after it is given back (by grant id: one never made
    /// changes nothing), so the caller goes on in order from the refused target as if it had
    /// taken the first ones one by one. A caller that goes away mid-call gives everything back.
    pub(crate) async fn try_all_at_once(
        self: &Arc<Self>,
        wanted: Vec<(Target, OwnerId)>,
        lease: Option<Duration>,
    ) -> Vec<Guard> {
        if self.is_closing() {
            // the caller goes on one by one, and is refused
            return Vec::new();
        }
        let lease_ms = Self::millis(lease.unwrap_or(self.config.watchdog_timeout()));
        let items: Vec<(Target, OwnerId, OwnerField, GrantId)> = wanted
            .into_iter()
            .map(|(target, owner)| {
                let field = self.owner_field(&owner);
                (target, owner, field, new_grant_id())
            })
            .collect();
        if items.is_empty() {
            return Vec::new();
        }
        let ops: Vec<Op> = items
            .iter()
            .map(|(target, _, field, grant)| Op::Acquire {
                target: target.clone(),
                owner: field.clone(),
                grant: grant.clone(),
                lease_ms,
                ask: Ask::Chained,
            })
            .collect();
        let undo: Vec<(Target, OwnerField, GrantId)> = items
            .iter()
            .map(|(t, _, f, g)| (t.clone(), f.clone(), g.clone()))
            .collect();
        let inner = self.clone();
        let call = async move { inner.send_ops(&ops).await };
        let inner = self.clone();
        let orphan = move |_| {
            for (target, field, grant) in undo {
                inner.give_back(target, field, grant);
            }
        };
        let sent = Instant::now();
        let replies = Detachable::new(&self.runtime, call, orphan).await;
        let mut tokens = Vec::with_capacity(items.len());
        for (reply, (target, ..)) in replies.iter().zip(&items) {
            match reply
                .as_ref()
                .ok()
                .filter(|synced| synced.acknowledged)
                .map(|synced| parse_attempt(&synced.reply, &target.names))
            {
                Some(Ok(Attempt::Granted(token) | Attempt::Holding(token))) => tokens.push(token),
                _ => break,
            }
        }
        // The run stopped at the first refused operation: the later ones were not run. Give
        // back only what may have been granted: the refused one when it was granted but not
        // acknowledged by the replicas, everything from it when the call's outcome is unknown.
        let refused_cleanly = matches!(
            replies.get(tokens.len()),
            Some(Ok(synced)) if matches!(
                parse_attempt(&synced.reply, &items[tokens.len()].0.names),
                Ok(Attempt::Held { .. })
            )
        );
        let mut items = items;
        let undo_from = tokens.len();
        for (target, _, field, grant) in items.drain(undo_from..) {
            if !refused_cleanly {
                self.give_back(target, field, grant);
            }
        }
        let watched = lease.is_none();
        let took = sent.elapsed();
        for (target, ..) in &items {
            let (kind, label) = (target.kind.mode, target.label);
            metrics::acquired(
                kind,
                label,
                Outcome::Granted,
                Some(How::Attempt),
                took,
                false,
            );
        }
        items
            .into_iter()
            .zip(tokens)
            .map(|((target, owner, field, grant), token)| {
                let cell = self.local.add_new_hold(
                    &target.names.lock,
                    target.kind,
                    &field,
                    &grant,
                    watched,
                    sent,
                    lease_ms,
                );
                Guard::new(
                    self.clone(),
                    target,
                    owner,
                    field,
                    grant,
                    token,
                    lease,
                    cell,
                )
            })
            .collect()
    }
}
