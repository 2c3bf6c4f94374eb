//! The Lua scripts every state change goes through, compiled once, and [`ScriptCall`], the one
//! way they are called.
//!
//! Each `.lua` file starts with a header naming its KEYS, ARGV (or parameters) and reply. The
//! lock operations are one script, [`OPS`]: a line of constants, `prelude.lua` (settings,
//! fencing and waiter helpers), `acquire.lua` and `release.lua` (one function each) and
//! `ops.lua`, which runs one or many operations per call. Scripts run with EVALSHA and are
//! loaded on NOSCRIPT (see the backend).

use std::sync::LazyLock;

use redis::{Cmd, Script, ToRedisArgs};

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!($file)));
    };
}

/// A lock's fence counter, waiting-services set, turn marker and wake-up channel are named
/// after the lock key with these suffixes.
pub(crate) const FENCE_SUFFIX: &str = ":fence";
pub(crate) const QUEUE_SUFFIX: &str = ":wq";
pub(crate) const TURN_SUFFIX: &str = ":turn";
pub(crate) const CHANNEL_SUFFIX: &str = ":ch";

/// How long a release reserves the lock for the waiting service it gives the next turn to. The
/// service claims it within a round trip or two; a service that went away costs at most this.
pub(crate) const TURN_MS: u64 = 250;

/// The lock operations: the constants above as Lua locals, then the scripts.
pub(crate) static OPS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "local fence_suffix, queue_suffix, turn_suffix, channel_suffix, turn_ms = \
         '{FENCE_SUFFIX}', '{QUEUE_SUFFIX}', '{TURN_SUFFIX}', '{CHANNEL_SUFFIX}', {TURN_MS}\n{}{}{}{}",
        include_str!("prelude.lua"),
        include_str!("acquire.lua"),
        include_str!("release.lua"),
        include_str!("ops.lua"),
    ))
});
script!(RENEW, "renew.lua");
script!(FORCE_UNLOCK, "force_unlock.lua");
script!(INSPECT, "inspect.lua");
script!(LEAVE, "leave.lua");

/// The hash field holding the fencing token of the current grant.
pub(crate) const FENCE_FIELD: &str = ":fence";

/// One `EVALSHA` of a script, built in a single command buffer (keys first, then arguments).
#[derive(Clone)]
pub(crate) struct ScriptCall {
    pub(crate) script: &'static Script,
    pub(crate) cmd: Cmd,
}

impl ScriptCall {
    /// A call of `script` with `keys` keys: push exactly that many with [`key`](Self::key)
    /// before the first [`arg`](Self::arg).
    pub(crate) fn new(script: &'static LazyLock<Script>, keys: usize) -> ScriptCall {
        let script: &'static Script = script;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys);
        ScriptCall { script, cmd }
    }

    pub(crate) fn key(&mut self, key: &str) -> &mut Self {
        self.cmd.arg(key);
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}
