//! Wake-ups: the shared subscriber's pushes are routed to the head waiter of the lock they name.

use std::sync::Weak;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine::Inner;
use crate::scripts::CHANNEL_SUFFIX;

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
                if ours && let Some(key) = push.data.first().and_then(lock_key_of_channel) {
                    inner.local.wake_head(key);
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
