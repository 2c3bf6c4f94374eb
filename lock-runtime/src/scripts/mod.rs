//! The Lua scripts every state change goes through, and [`ScriptCall`], the one way they are
//! called.
//!
//! Each `.lua` file starts with a header naming its KEYS, ARGV (or parameters) and reply. The
//! operations of a lock kind are one script, built per kind and service settings by [`ops`]:
//! `prelude.lua` (settings, fencing and waiter helpers), the kind's `acquire` and `release`
//! functions (in the kind's folder, e.g. `mutex/`) and `ops.lua`, which runs one or many
//! operations per call; a kind's renewals are `clock.lua`, `renew.lua`, the kind's `renew`
//! function and `renew_run.lua`, built by [`renew`]. The other scripts are static. The
//! operations run as a Redis Function where the server allows it ([`Ops`]), everything else with
//! `EVALSHA`; both are loaded where a server lacks them (see `backend::invoke`).

use std::sync::LazyLock;

use std::io::Write as _;

use redis::{Cmd, RedisWrite as _, Script, ToRedisArgs};

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

/// A kind's operations script in its two forms: the `EVALSHA` script, and the same Lua as a
/// Redis Function (7.0+), whose library defines the script's functions once, when it is loaded,
/// instead of on every call. The backend calls the Function where the server has Functions and
/// the user may load and call them, else the script (see `backend::invoke`).
pub(crate) struct Ops {
    pub(crate) script: Script,
    pub(crate) function: Function,
    /// Whether an operation passes every key it may touch (see [`ops`]), or its lock key only.
    pub(crate) declare_all: bool,
    /// The keys one operation passes: the lock, and with `declare_all` its fence counter, the
    /// waiting-services zset and the kind's fourth key if it has one.
    pub(crate) keys_per_op: usize,
}

/// How the keys of a lock operation reach its script.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpKeys<'a> {
    /// Redis Cluster: an operation passes in KEYS every key it may touch (its lock, the fence
    /// counter of the lock's slot, the waiting-services zset, the kind's fourth key), so that a
    /// call stays correct while its slot migrates.
    Declared,
    /// One server: an operation passes its lock key only; the script names the other keys
    /// after it, and every lock draws its tokens from the server's one fence `counter`, a
    /// literal in the script: three arguments fewer per operation.
    Named {
        /// The fence counter's key.
        counter: &'a str,
    },
}

/// `text` as a Lua string literal: in single quotes, with every byte but letters, digits and a
/// few punctuation characters written as a decimal escape (a key prefix is any text).
fn lua_text(text: &str) -> String {
    let mut literal = String::with_capacity(text.len() + 2);
    literal.push('\'');
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b":{}-_./@#".contains(&byte) {
            literal.push(char::from(byte));
        } else {
            literal.push_str(&format!("\\{byte:03}"));
        }
    }
    literal.push('\'');
    literal
}

/// A Redis Function and the library that registers it (`FUNCTION LOAD REPLACE`).
pub(crate) struct Function {
    /// The function's name, also the library's: `lockrt_` and the script's SHA-1, so clients
    /// with other settings or another version of the scripts load libraries of their own.
    pub(crate) name: String,
    pub(crate) library: String,
}

/// What a script that starts with `clock.lua` runs after it (the script form, `EVALSHA`) or on
/// every call (the Function form: a library reaches no global while it loads): the locals of
/// the functions the operations call most.
const SET_RCALL: &str =
    "rcall, sformat, sbyte, sfind = redis.call, string.format, string.byte, string.find\n";

/// The operations of the kind whose Lua is `kind_lua`, with a service's settings: `clock.lua`,
/// `reply.lua`, the kind's `kind_first` part (its common operations done before the rest is
/// defined, see [`Kind::lua_first`](crate::engine::Kind)), `prelude.lua`, the kind's functions
/// and `ops.lua`, with every `$` name replaced by its literal (see `prelude.lua`). Services with
/// the same settings share one script. In the Function form the definitions come first and run
/// once; the registered function runs the per-call parts: the clock's reset and the parts of
/// `kind_first` and `ops.lua` after their `--@call` lines. `fourth_key`: the suffix of the
/// kind's fourth key after the lock key, if it has one; `extra_arg`: the kind's acquires carry
/// an extra argument (five per operation, else four). `keys`: how an operation's keys reach
/// the script (see [`OpKeys`]).
pub(crate) fn ops(
    kind_first: &str,
    kind_lua: &[&str],
    fourth_key: Option<&str>,
    keys: OpKeys<'_>,
    extra_arg: bool,
    publish: &str,
    yield_horizon_ms: u64,
) -> Ops {
    let declare_all = matches!(keys, OpKeys::Declared);
    let keys_per_op = match (declare_all, fourth_key) {
        (false, _) => 1,
        (true, None) => 3,
        (true, Some(_)) => 4,
    };
    let (fence_key, queue_key, fourth) = match keys {
        OpKeys::Declared => (
            "keys[k + 1]".to_owned(),
            "keys[k + 2]".to_owned(),
            fourth_key.map(|_| "keys[k + 3]".to_owned()),
        ),
        OpKeys::Named { counter } => (
            lua_text(counter),
            format!("keys[k] .. '{QUEUE_SUFFIX}'"),
            fourth_key.map(|suffix| format!("keys[k] .. '{suffix}'")),
        ),
    };
    let literals = [
        ("$CHANNEL_SUFFIX", format!("'{CHANNEL_SUFFIX}'")),
        ("$MAX_LEASE", MAX_LEASE_MS.to_string()),
        ("$TURN_MS", TURN_MS.to_string()),
        ("$PUBLISH", format!("'{publish}'")),
        ("$YIELD_HORIZON", yield_horizon_ms.to_string()),
        ("$KEYS", keys_per_op.to_string()),
        ("$FENCE_K", fence_key),
        ("$QUEUE_K", queue_key),
        ("$FOURTH_K", fourth.unwrap_or_else(|| "nil".to_owned())),
        ("$ARGS", if extra_arg { "5" } else { "4" }.to_owned()),
        (
            "$EXTRA_A",
            if extra_arg { "argv[a + 4]" } else { "''" }.to_owned(),
        ),
        (
            "$FAST_OP",
            if kind_first.is_empty() {
                "nil"
            } else {
                "fast_op"
            }
            .to_owned(),
        ),
    ];
    let with_literals = |mut text: String| {
        for (name, literal) in &literals {
            text = text.replace(name, literal);
        }
        text
    };
    let (first_declared, first_per_call) = kind_first
        .split_once("\n--@call\n")
        .unwrap_or(("", kind_first));
    // the parts every call shares: the clock and tokens, and how the reply is written
    let shared = [include_str!("clock.lua"), include_str!("reply.lua")].concat();
    let prelude = include_str!("prelude.lua");
    let kind = kind_lua.concat();
    let (ops_declared, per_call) = include_str!("ops.lua")
        .split_once("\n--@call\n")
        .expect("ops.lua has a --@call line");
    let script = Script::new(&with_literals(
        [
            &shared,
            SET_RCALL,
            first_declared,
            "\n",
            first_per_call,
            prelude,
            &kind,
            ops_declared,
            "\n",
            per_call,
        ]
        .concat(),
    ));
    let name = format!("lockrt_{}", script.get_hash());
    let library = with_literals(format!(
        "#!lua name={name}\n{shared}{first_declared}\n{prelude}{kind}{ops_declared}\n\
         redis.register_function('{name}', function(KEYS, ARGV)\n\
         {SET_RCALL}time, clock_ms, clock_us_text, drawn_key = nil, nil, nil, nil\n\
         deferring, dirty = false, false\n\
         {first_per_call}{per_call}\nend)\n"
    ));
    Ops {
        script,
        function: Function { name, library },
        declare_all,
        keys_per_op,
    }
}

/// The renew script of the kind whose `renew` function is defined by `kind_lua` (see
/// `renew.lua`): the shared clock and lease check, the call's head, the kind's Lua and the loop
/// over the holds.
pub(crate) fn renew(kind_lua: &[&str]) -> Script {
    let mut text = [
        include_str!("clock.lua"),
        SET_RCALL,
        include_str!("renew.lua"),
    ]
    .concat();
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
    /// Set when `cmd` is an `FCALL` of this Function (of `script`'s Lua).
    pub(crate) function: Option<&'a Function>,
    pub(crate) cmd: Cmd,
}

impl<'a> ScriptCall<'a> {
    /// A call of `script` with `keys` keys: push exactly that many with [`key`](Self::key)
    /// before the first [`arg`](Self::arg).
    pub(crate) fn new(script: &'a Script, keys: usize) -> ScriptCall<'a> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys);
        ScriptCall {
            script,
            function: None,
            cmd,
        }
    }

    /// A call of a kind's operations with `keys` keys: an `FCALL` of their Function when
    /// `function` is set, else an `EVALSHA` of their script.
    pub(crate) fn ops(ops: &'a Ops, keys: usize, function: bool) -> ScriptCall<'a> {
        if !function {
            return ScriptCall::new(&ops.script, keys);
        }
        // sized for the call at once (an operation brings 3-4 keys and 4-5 arguments): the
        // command's buffers do not grow argument by argument
        let mut cmd = Cmd::with_capacity(4 + keys * 3, 64 + keys * 64);
        cmd.arg("FCALL").arg(&ops.function.name).arg(keys);
        ScriptCall {
            script: &ops.script,
            function: Some(&ops.function),
            cmd,
        }
    }

    /// The same call as an `EVALSHA` of the script (for a server that refused the Function).
    pub(crate) fn as_script(&self) -> ScriptCall<'a> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash());
        // after the command's name and the function's: the key count, keys and arguments
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        ScriptCall::new_from(self.script, cmd)
    }

    fn new_from(script: &'a Script, cmd: Cmd) -> ScriptCall<'a> {
        ScriptCall {
            script,
            function: None,
            cmd,
        }
    }

    pub(crate) fn key(&mut self, key: &str) -> &mut Self {
        self.cmd.arg(key);
        self
    }

    /// The key named `<lock><suffix>` (a lock's waiting set, turn marker, ...), written into
    /// the call without building its name first.
    pub(crate) fn key_suffixed(&mut self, lock: &str, suffix: &str) -> &mut Self {
        self.arg_joined(&[lock, suffix])
    }

    /// One argument made of `parts` one after another (an operation's `<grant>|<owner>`),
    /// written straight into the call: no `String` first, no formatting.
    pub(crate) fn arg_joined(&mut self, parts: &[&str]) -> &mut Self {
        let mut arg = self.cmd.writer_for_next_arg();
        for part in parts {
            // (writing into the command's own buffer cannot fail)
            let _ = arg.write_all(part.as_bytes());
        }
        drop(arg);
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// An argument written as `arg` displays, straight into the call (no `String` first).
    pub(crate) fn arg_fmt(&mut self, arg: std::fmt::Arguments<'_>) -> &mut Self {
        self.cmd.write_arg_fmt(arg);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: &str = include_str!("../kinds/mutex/fast.lua");
    const MUTEX: [&str; 3] = [
        include_str!("../kinds/mutex/value.lua"),
        include_str!("../kinds/mutex/acquire.lua"),
        include_str!("../kinds/mutex/release.lua"),
    ];

    /// The mutex's operations with its fast path, the `:wh` fourth key and no extra argument.
    fn mutex_ops(keys: OpKeys<'_>, publish: &str, yield_horizon_ms: u64) -> Ops {
        ops(
            FAST,
            &MUTEX,
            Some(":wh"),
            keys,
            false,
            publish,
            yield_horizon_ms,
        )
    }

    #[test]
    fn ops_gets_every_setting_as_a_literal() {
        let kind = MUTEX;
        let ops = mutex_ops(OpKeys::Declared, "spublish", 31_000);
        let text = &ops.function.library;
        assert!(!text.contains('$'), "a setting was left out");
        assert!(text.contains("redis.call('spublish', lock .. ':ch', target)"));
        assert!(text.contains("register_waiter(queue, 31000)"));
        assert!(text.contains("'px', 250)"));
        assert!(text.contains("for i = 1, #KEYS / 4 do"));
        assert!(text.contains("a = a + 4"), "four arguments per operation");
        assert!(text.contains(FAST.lines().next().unwrap()));
        let other = super::ops("", &kind, Some(":wh"), OpKeys::Declared, true, "publish", 1);
        assert!(other.function.library.contains("keys[k + 2], keys[k + 3],"));
        assert!(
            other
                .function
                .library
                .contains("argv[a + 3], argv[a + 4], op == 'f'")
        );
        assert_ne!(ops.script.get_hash(), other.script.get_hash());
        // on one server an operation passes its lock; the script names the others after it,
        // and the server's one counter as it is written (any prefix: escaped)
        let named = OpKeys::Named {
            counter: "it's\\$KEYS:fence:{0}",
        };
        let one_server = mutex_ops(named, "publish", 1);
        let text = &one_server.function.library;
        assert!(text.contains("for i = 1, #KEYS / 1 do"));
        assert_eq!((one_server.keys_per_op, ops.keys_per_op), (1, 4));
        assert!(text.contains("if #KEYS == 1 then"), "the lone fast path");
        let counter = r"'it\039s\092\036KEYS:fence:{0}'";
        assert!(text.contains(&format!(
            "release(keys[k], {counter}, keys[k] .. ':wq', keys[k] .. ':wh',"
        )));
        assert!(text.contains(&format!("next_token({counter})")));
        assert!(!text.contains("keys[k + 1]") && !text.contains("keys[k + 2]"));
        assert_ne!(one_server.script.get_hash(), ops.script.get_hash());
    }

    #[test]
    fn the_function_form_declares_once_and_runs_the_rest_per_call() {
        let ops = mutex_ops(OpKeys::Declared, "publish", 31_000);
        let Function { name, library } = &ops.function;
        assert_eq!(*name, format!("lockrt_{}", ops.script.get_hash()));
        assert!(library.starts_with(&format!("#!lua name={name}\n")));
        let (declared, per_call) = library
            .split_once(&format!(
                "redis.register_function('{name}', function(KEYS, ARGV)\n"
            ))
            .expect("the function is registered");
        // the fast path's state is declared before the functions that read it, reset per call
        let state = declared.find("local read_first = nil").unwrap();
        assert!(state < declared.find("local function release").unwrap());
        assert!(per_call.starts_with(&format!(
            "{SET_RCALL}time, clock_ms, clock_us_text, drawn_key = nil, nil, nil, nil\n\
             deferring, dirty = false, false\nread_first = nil\n"
        )));
        // a library reaches no global while it loads: the locals of the functions the
        // operations call most are set per call
        assert!(declared.contains("local rcall, sformat, sbyte, sfind = nil, nil, nil, nil"));
        // a library that reads KEYS or ARGV when it is loaded fails to load
        let code = declared
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"));
        assert!(
            code.clone()
                .all(|l| !l.contains("ARGV") && !l.contains("KEYS"))
        );
        assert!(per_call.contains("service, sent = ARGV[1], ARGV[2]"));
        assert!(per_call.ends_with("return table.concat(replies, ' ')\n\nend)\n"));
    }
}
