//! The Lua scripts every state change goes through, compiled once.
//!
//! Each `.lua` file starts with a header naming its KEYS, ARGV and reply. Scripts that grant
//! locks are prefixed with `prelude.lua` (fencing and waiter helpers). They run with EVALSHA and
//! fall back to loading the script on NOSCRIPT (`redis::Script` does that).

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($name:ident, $($file:literal),+) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(concat!($(include_str!($file)),+)));
    };
}

script!(ACQUIRE, "prelude.lua", "acquire.lua");
script!(RELEASE, "prelude.lua", "release.lua");
script!(RENEW, "renew.lua");
script!(FORCE_UNLOCK, "force_unlock.lua");
script!(INSPECT, "inspect.lua");
script!(LEAVE, "leave.lua");

/// The hash field holding the fencing token of the current grant.
pub(crate) const FENCE_FIELD: &str = ":fence";
