//! The Lua scripts every state change goes through, and [`ScriptCall`], the one way they are
//! called.
//!
//! Each `.lua` file starts with a header naming its KEYS, ARGV (or parameters) and reply. The
//! operations of a lock kind are one script, built per kind and service settings by [`ops`]:
//! `prelude.lua` (settings, fencing and waiter helpers), the kind's `acquire` and `release`
//! functions (in the kind's folder, e.g. `mutex/`) and `ops.lua`, which runs one or many
//! operations per call; a kind's renewals are `clock.lua`, `renew.lua`, the kind's `renew`
//! function and `renew_run.lua`, built by [`renew`]. The other scripts are static. Scripts run with EVALSHA and are loaded
//! on NOSCRIPT (see the backend).

use std::sync::LazyLock;

use redis::{Cmd, Script, ToRedisArgs};

/// A static script from a `.lua` file of this folder.
macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!($file)));
    };
}

/// A lock's waiting-services set, turn marker and wake-up channel are named after the lock key
/// with these suffixes. A lock key always ends with the `}` of its hash tag (see `KeyNames`),
/// so no lock key can be another lock's set or marker.
pub(crate) const QUEUE_SUFFIX: &str = ":wq";
pub(crate) const TURN_SUFFIX: &str = ":turn";
/// A mutex's waiting services' head waiters (see `kinds/mutex/value.lua`).
pub(crate) const HEADS_SUFFIX: &str = ":wh";
pub(crate) const CHANNEL_SUFFIX: &str = ":ch";

/// How long a release reserves the lock for the waiting service it gives the next turn to. The
/// service claims it within a round trip or two; a service that went away costs at most this.
pub(crate) const TURN_MS: u64 = 250;

/// The longest lease the scripts accept (see [`crate::vocab::MAX_LEASE_MS`]).
pub(crate) use crate::vocab::MAX_LEASE_MS;

/// The operations of the kind whose Lua is `kind_lua`, with a service's settings: `clock.lua`,
/// the kind's `kind_first` part (its common operations done before the rest is defined, see
/// [`Kind::lua_first`](crate::engine::Kind)), `prelude.lua`, the kind's functions and `ops.lua`, with every `$` name replaced by its literal (see `prelude.lua`). Services with
/// the same settings share one script.
pub(crate) fn ops(
    kind_first: &str,
    kind_lua: &[&str],
    four_keys: bool,
    publish: &str,
    yield_horizon_ms: u64,
) -> Script {
    Script::new(&ops_text(
        kind_first,
        kind_lua,
        four_keys,
        publish,
        yield_horizon_ms,
    ))
}

fn ops_text(
    kind_first: &str,
    kind_lua: &[&str],
    four_keys: bool,
    publish: &str,
    yield_horizon_ms: u64,
) -> String {
    let mut text = String::from(include_str!("clock.lua"));
    text.push_str(kind_first);
    text.push_str(include_str!("prelude.lua"));
    for part in kind_lua {
        text.push_str(part);
    }
    text.push_str(include_str!("ops.lua"));
    let literals = [
        ("$CHANNEL_SUFFIX", format!("'{CHANNEL_SUFFIX}'")),
        ("$MAX_LEASE", MAX_LEASE_MS.to_string()),
        ("$TURN_MS", TURN_MS.to_string()),
        ("$PUBLISH", format!("'{publish}'")),
        ("$YIELD_HORIZON", yield_horizon_ms.to_string()),
        ("$KEYS", if four_keys { "4" } else { "3" }.to_owned()),
        (
            "$FOURTH_1",
            if four_keys { "KEYS[4]" } else { "nil" }.to_owned(),
        ),
        (
            "$FOURTH_K",
            if four_keys { "KEYS[k + 3]" } else { "nil" }.to_owned(),
        ),
    ];
    for (name, literal) in literals {
        text = text.replace(name, &literal);
    }
    text
}

/// The renew script of the kind whose `renew` function is defined by `kind_lua` (see
/// `renew.lua`): the shared clock and lease check, the call's head, the kind's Lua and the loop
/// over the holds.
pub(crate) fn renew(kind_lua: &[&str]) -> Script {
    let mut text = [include_str!("clock.lua"), include_str!("renew.lua")].concat();
    for part in kind_lua {
        text.push_str(part);
    }
    text.push_str(include_str!("renew_run.lua"));
    let text = text.replace("$MAX_LEASE", &MAX_LEASE_MS.to_string());
    Script::new(&text)
}

script!(FORCE_UNLOCK, "force_unlock.lua");
script!(INSPECT, "inspect.lua");
script!(LEAVE, "leave.lua");

/// The hash field holding the fencing token of the current grant.
pub(crate) const FENCE_FIELD: &str = ":fence";

/// One `EVALSHA` of a script, built in a single command buffer (keys first, then arguments).
#[derive(Clone)]
pub(crate) struct ScriptCall<'a> {
    pub(crate) script: &'a Script,
    pub(crate) cmd: Cmd,
}

impl<'a> ScriptCall<'a> {
    /// A call of `script` with `keys` keys: push exactly that many with [`key`](Self::key)
    /// before the first [`arg`](Self::arg).
    pub(crate) fn new(script: &'a Script, keys: usize) -> ScriptCall<'a> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: &str = include_str!("../kinds/mutex/fast.lua");

    #[test]
    fn ops_gets_every_setting_as_a_literal() {
        let kind = [
            include_str!("../kinds/mutex/value.lua"),
            include_str!("../kinds/mutex/acquire.lua"),
            include_str!("../kinds/mutex/release.lua"),
        ];
        let text = ops_text(FAST, &kind, true, "spublish", 31_000);
        assert!(!text.contains('$'), "a setting was left out");
        assert!(text.contains("redis.call('spublish', lock .. ':ch', target)"));
        assert!(text.contains("register_waiter(queue, 31000)"));
        assert!(text.contains("'px', 250)"));
        assert!(text.contains("for i = 1, #KEYS / 4 do"));
        assert!(text.contains(FAST.lines().next().unwrap()));
        assert!(ops_text("", &kind, true, "publish", 1).contains("KEYS[k + 2], KEYS[k + 3],"));
        assert_ne!(
            ops(FAST, &kind, true, "spublish", 31_000).get_hash(),
            ops(FAST, &kind, true, "publish", 31_000).get_hash()
        );
    }
}
