//! The ids the engine keeps holds by: lock keys, owner fields and grant ids.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

/// A lock key as stored on Redis (prefix and hash tag applied).
pub(crate) type LockKey = Arc<str>;
/// A map by lock key. Its hasher is seeded at random per map, like the standard one, and is
/// several times cheaper on short keys: every operation looks its key up a few times.
pub(crate) type KeyMap<V> = std::collections::HashMap<LockKey, V, foldhash::fast::RandomState>;
/// An owner as stored on Redis: `<process instance>:<owner id>`.
pub(crate) type OwnerField = Arc<str>;
/// The id of one grant (a hold's generation): 16 hex digits, chosen by the client for the
/// attempt that may make the grant, stored with it on Redis. Releasing by grant id undoes
/// exactly that grant, never an older or newer one of the same owner.
pub(crate) type GrantId = Arc<str>;

/// A new grant id, unique in this process (and, with its random start, across restarts).
pub(crate) fn new_grant_id() -> GrantId {
    static NEXT: LazyLock<AtomicU64> = LazyLock::new(|| AtomicU64::new(rand::random()));
    crate::owner::hex_id(&[NEXT.fetch_add(1, Ordering::Relaxed)])
}
