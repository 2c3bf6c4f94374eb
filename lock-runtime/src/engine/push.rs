//! Grants pushed across services: a mutex release that finds another service waiting grants
//! the lock to that service's head waiter in the same script and publishes the grant (see
//! `kinds/mutex/release.lua`). The head holds the lock from the message on, without asking
//! Redis; the grant lives for a claim window ([`TURN_MS`]), which the holder lengthens to its
//! lease when its body runs past a fifth of it, so that a service that went away strands the
//! lock no longer than a turn would. A grant whose message comes when less than a third of the
//! window is left is not used: its waiter asks Redis, which confirms it if it is still there
//! (see `Local::turn`).
//!
//! The holder's lease runs from no later than the grant: the message says when the head's
//! registering call was sent (this service's clock, [`Engine::sent_arg`]) and how many
//! microseconds of server time passed between that call's run and the grant; the grant came
//! at least that long (less 1% for clock drift) after the send.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::core::Engine;
use super::ids::{GrantId, LockKey, OwnerField};
use super::line::Delivery;
use super::names::KeyNames;
use super::target::Target;
use crate::scripts::{ScriptCall, TURN_MS};

/// A grant another service's release made to a waiter of this service, as its message tells it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pushed {
    grant: GrantId,
    token: u64,
    /// When the head's registering call was sent, in microseconds of [`Engine::sent_arg`].
    sent_us: u64,
    /// Server microseconds between that call's run and the grant.
    after_us: u64,
    owner: OwnerField,
}

impl Pushed {
    /// The grant in `message` when it is addressed to `service`:
    /// `service\ngrant\ntoken\nsent\nafter\nowner`; `None` for any other message.
    pub(crate) fn parse(message: &[u8], service: &str) -> Option<Pushed> {
        let text = std::str::from_utf8(message).ok()?;
        let rest = text.strip_prefix(service)?.strip_prefix('\n')?;
        let mut fields = rest.splitn(5, '\n');
        let grant = fields.next()?;
        let token = fields.next()?.parse().ok()?;
        let sent_us = fields.next()?.parse().ok()?;
        let after_us = fields.next()?.parse().ok()?;
        let owner = fields.next()?;
        Some(Pushed {
            grant: grant.into(),
            token,
            sent_us,
            after_us,
            owner: owner.into(),
        })
    }
}

/// Whether a wake-up message names a service (its id, alone or before a pushed grant's
/// fields): the part before the first newline.
pub(crate) fn addressee(message: &[u8]) -> &[u8] {
    message.split(|b| *b == b'\n').next().unwrap_or(message)
}

impl Engine {
    /// What `ops.lua` gets as the call's send time: microseconds since the service started, or
    /// nothing when replicas must acknowledge every grant before its holder uses it (a pushed
    /// grant would reach the holder before that): such a service gets turns instead.
    pub(crate) fn sent_arg(&self) -> Option<u64> {
        (self.config.sync_replicas() == 0)
            .then(|| u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    /// Hands the grant `pushed` of the lock `key` to its waiter, or gives it back when that
    /// waiter left.
    pub(crate) fn deliver_push(self: &Arc<Self>, key: &str, pushed: Pushed) {
        let after = Duration::from_micros(pushed.after_us - pushed.after_us / 100);
        let since = self
            .epoch
            .checked_add(Duration::from_micros(pushed.sent_us) + after)
            .map_or_else(Instant::now, |t| t.min(Instant::now()));
        let delivery = self.local.pushed(key, &pushed.grant, pushed.token, since);
        if delivery == Delivery::Gone {
            tracing::debug!(key, grant = %pushed.grant, "a grant pushed to a waiter that left; giving it back");
            let names = KeyNames::of_lock_key(self.config.prefix(), LockKey::from(key));
            let target = Target::new(self.pushed_kind, names);
            self.give_back(target, pushed.owner, pushed.grant);
        }
    }

    /// After a pushed grant (`since`: the earliest its claim window can have started): once a
    /// fifth of that window has passed and the hold is still here, lengthens it to the
    /// holder's lease (`lease_ms` from `since`, or the watchdog's from now for `watched`), as a
    /// renewal would; tries twice more, a fifth of the window apart, if that fails.
    pub(crate) fn claim_later(
        self: &Arc<Self>,
        target: &Target,
        field: &OwnerField,
        grant: &GrantId,
        since: Instant,
        lease_ms: u64,
        watched: bool,
    ) {
        let (weak, kind, key) = (Arc::downgrade(self), target.kind, target.names.lock.clone());
        let (field, grant) = (field.clone(), grant.clone());
        let fifth = Duration::from_millis(TURN_MS / 5);
        self.runtime.spawn(async move {
            for at in [since + fifth, since + fifth * 2, since + fifth * 3] {
                tokio::time::sleep_until(at.into()).await;
                let Some(inner) = weak.upgrade() else { return };
                if !inner.local.holds_live(&key, &grant) {
                    return;
                }
                let sent = Instant::now();
                let lease = if watched {
                    lease_ms
                } else {
                    let passed = sent.saturating_duration_since(since);
                    lease_ms.saturating_sub(Engine::millis(passed)).max(1)
                };
                let mut call = ScriptCall::new(kind.renew, 1);
                call.key(&key).arg(lease).arg("r").arg(&*field).arg(&*grant);
                match inner.backend.run::<Vec<i64>>("claim", &call).await {
                    Ok(flags) if flags.first() == Some(&1) => {
                        inner.local.renewed(&key, &grant, sent, lease, true);
                        return;
                    }
                    Ok(flags) if flags.first() == Some(&0) => {
                        inner.local.renewed(&key, &grant, sent, lease, false);
                        return;
                    }
                    other => {
                        tracing::debug!(key = %key, ?other, "claiming a pushed grant failed");
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse() {
        let m = b"svc~1\n00000000000000aa\n1764230000123456\n99\n1500\nnode~9:req:a\nb";
        let p = Pushed::parse(m, "svc~1").unwrap();
        assert_eq!(&*p.grant, "00000000000000aa");
        assert_eq!(p.token, 1_764_230_000_123_456);
        assert_eq!((p.sent_us, p.after_us), (99, 1500));
        assert_eq!(&*p.owner, "node~9:req:a\nb");
        assert_eq!(Pushed::parse(m, "svc~"), None);
        assert_eq!(Pushed::parse(m, "svc~2"), None);
        assert_eq!(Pushed::parse(b"svc~1", "svc~1"), None);
        assert_eq!(Pushed::parse(b"svc~1\nx\n1\n", "svc~1"), None);
        assert_eq!(addressee(m), b"svc~1");
        assert_eq!(addressee(b"0"), b"0");
    }
}
