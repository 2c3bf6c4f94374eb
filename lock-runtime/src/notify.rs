//! Wake-ups: the shared subscriber's pushes are routed to the head waiter of the lock they name.

use std::sync::{Arc, Weak};
use std::time::Duration;

use rand::Rng;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine::Inner;
use crate::scripts::{CHANNEL_SUFFIX, TURN_MS};

/// Routes pushes until the service is dropped.
pub(crate) async fn run(inner: Weak<Inner>, mut pushes: UnboundedReceiver<PushInfo>) {
    while let Some(push) = pushes.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                // The payload names the service whose turn it is ("0": anyone's).
                let ours = match push.data.get(1) {
                    Some(Value::BulkString(who)) => {
                        who == b"0" || who == inner.service_id.as_bytes()
                    }
                    _ => true,
                };
                let Some(key) = push.data.first().and_then(lock_key_of_channel) else {
                    continue;
                };
                if ours {
                    inner.local.wake_head(key);
                } else if inner.local.has_waiters(key) {
                    // Another service's turn. If that service went away, nobody claims it and
                    // it runs out: look again then, rather than sleeping through the rest of
                    // the released lock's lease.
                    let (weak, key) = (Arc::downgrade(&inner), key.to_owned());
                    let jitter = Duration::from_millis(rand::rng().random_range(1..=50));
                    inner.runtime.spawn(async move {
                        tokio::time::sleep(Duration::from_millis(TURN_MS) + jitter).await;
                        if let Some(inner) = weak.upgrade() {
                            inner.local.wake_head(&key);
                        }
                    });
                }
            }
            // Messages published while disconnected are lost: every head looks again (the
            // client resubscribes on reconnect before it runs their commands).
            PushKind::Disconnection => inner.local.wake_all_heads(),
            _ => {}
        }
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
