//! `lockctl`: look at and break the distributed locks of `lock-runtime` on Redis, from a
//! terminal (`list`, `show`, `watch`, `unlock`) or a small web console (`serve`).
//!
//! ```text
//! lockctl --config lock.toml list 'goods:*'
//! lockctl show catalog:7 --kind rw
//! lockctl unlock goods:42 --yes
//! lockctl serve --listen 127.0.0.1:7373 --allow-unlock
//! ```
//!
//! Exit codes: 0 done; 1 not found (`show` of a lock nobody holds) or nothing removed (`unlock`
//! of a free lock, or a confirmation answered no); 2 a usage or configuration mistake; 3 Redis
//! failed (unreachable, refused credentials, no answer in time).

mod console;
mod render;

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lock_runtime::{ErrorKind, LockConfig, LockError, LockInfo, LockKind, LockService};

/// Look at and break the distributed locks of lock-runtime on Redis.
#[derive(Debug, Parser)]
#[command(
    name = "lockctl",
    version,
    after_help = "Exit codes: 0 done; 1 not found or nothing removed; 2 usage or configuration \
                  error; 3 Redis error."
)]
struct Cli {
    /// The lock configuration (the services' lock.toml); default: $LOCK_CONFIG, else
    /// ./lock.toml
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One line per held lock of every kind: key, kind, holder, its instance and request, how
    /// long it has been held, hold count, remaining lease, fencing token, callers waiting per
    /// service.
    List {
        /// Only keys matching this glob (`*`, `?`, `[abc]`), e.g. 'goods:*'
        pattern: Option<String>,
        /// Print a JSON array, one lock per line
        #[arg(long)]
        json: bool,
    },
    /// Everything known about one lock: every holder with its instance, request, age, lease
    /// and permits, fencing tokens, the waiting services and their callers.
    Show {
        /// The lock's key (a semaphore's name)
        key: String,
        #[command(flatten)]
        kind: KindArg,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// The list, refreshed until Ctrl-C.
    Watch {
        /// Only keys matching this glob
        pattern: Option<String>,
        /// Time between refreshes, e.g. 500ms, 2s
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
    },
    /// Force-unlock a lock whoever holds it (its holders lose it); asks first unless --yes.
    Unlock {
        /// The lock's key (a semaphore's name)
        key: String,
        #[command(flatten)]
        kind: KindArg,
        /// Do not ask for confirmation (required when stdin is not a terminal)
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// A web console: held locks, holders and their instances, ages, leases counting down,
    /// waiters per service, recent events, and whether the data is stale.
    Serve {
        /// Address to listen on; a non-loopback address exposes lock names and holders to
        /// whoever can reach it
        #[arg(long, default_value = console::DEFAULT_LISTEN)]
        listen: std::net::SocketAddr,
        /// Offer force-unlock in the console (behind a confirmation); without it the unlock
        /// endpoint answers 403. Only on a trusted network: whoever reaches the console can
        /// unlock
        #[arg(long)]
        allow_unlock: bool,
        /// Also answer requests naming the console by this host name (a DNS name of the
        /// machine, a reverse proxy's name); without PORT on any port; repeatable. Besides
        /// these the console answers only to localhost, 127.0.0.1, ::1 and its own address
        #[arg(long = "allow-host", value_name = "NAME[:PORT]", value_parser = console::parse_allowed_host)]
        allow_host: Vec<console::AllowedHost>,
        /// Only keys matching this glob
        pattern: Option<String>,
        /// Time between refreshes, e.g. 500ms, 2s
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
    },
}

#[derive(Debug, Args)]
struct KindArg {
    /// The kind of lock: mutex, rw or sem; needed when one key names locks of several kinds
    #[arg(long, value_parser = parse_kind)]
    kind: Option<LockKind>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let ms = lock_duration::parse_millis(text)?;
    if ms == 0 {
        return Err("the interval must be longer than 0ms".to_owned());
    }
    Ok(Duration::from_millis(ms))
}

fn parse_kind(text: &str) -> Result<LockKind, String> {
    text.parse().map_err(|e: LockError| e.to_string())
}

/// How a command ended, as an exit code (see the crate docs).
#[derive(Debug)]
enum Failure {
    /// 1: nothing found or removed; the message was printed.
    NotFound,
    /// 2: a usage or configuration mistake; printed through `render::text` (it may name a
    /// key).
    Usage(String),
    /// A library error: 2 or 3 by its kind.
    Lock(LockError),
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Failure::Lock(e)
    }
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::NotFound => 1,
            Failure::Usage(_) => 2,
            Failure::Lock(e) => match e.kind() {
                ErrorKind::Config
                | ErrorKind::NotInitialized
                | ErrorKind::InvalidKey
                | ErrorKind::InvalidArgument => 2,
                _ => 3,
            },
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockctl: cannot start the async runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            match &failure {
                Failure::NotFound => {}
                Failure::Usage(message) => eprintln!("lockctl: {}", render::text(message)),
                Failure::Lock(e) => eprintln!("lockctl: {}", render::message(&e.to_string())),
            }
            ExitCode::from(failure.exit_code())
        }
    }
}

/// The configuration file: `--config`, else `$LOCK_CONFIG`, else `./lock.toml`.
fn config_path(flag: Option<PathBuf>) -> Result<PathBuf, Failure> {
    if let Some(path) = flag {
        return Ok(path);
    }
    if let Some(path) = std::env::var_os(lock_runtime::CONFIG_ENV) {
        return Ok(PathBuf::from(path));
    }
    let default = PathBuf::from(lock_runtime::DEFAULT_CONFIG_FILE);
    if default.exists() {
        return Ok(default);
    }
    Err(Failure::Usage(format!(
        "no lock configuration: pass --config PATH, set ${} or create ./{} (the same file \
         the services use)",
        lock_runtime::CONFIG_ENV,
        lock_runtime::DEFAULT_CONFIG_FILE
    )))
}

/// Connects with the services' configuration, under a name of its own: the journal says that
/// lockctl (on which host) force-unlocked a lock, not the service whose file it read.
async fn connect(flag: Option<PathBuf>) -> Result<LockService, Failure> {
    let config = LockConfig::from_file(config_path(flag)?)?;
    let name = format!("lockctl@{}", LockConfig::default_instance_name());
    Ok(LockService::connect(config.with_instance_name(name)).await?)
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let locks = connect(cli.config).await?;
    match cli.command {
        Command::List { pattern, json } => {
            let list = locks.list(pattern.as_deref()).await?;
            let mut out = std::io::stdout().lock();
            let text = match json {
                true => render::json_lines(&list),
                false => render::table(&list),
            };
            let _ = out.write_all(text.as_bytes());
            Ok(())
        }
        Command::Show { key, kind, json } => show(&locks, &key, kind.kind, json).await,
        Command::Watch { pattern, interval } => watch(&locks, pattern.as_deref(), interval).await,
        Command::Unlock { key, kind, yes } => unlock(&locks, &key, kind.kind, yes).await,
        Command::Serve {
            listen,
            allow_unlock,
            allow_host,
            pattern,
            interval,
        } => {
            let options = console::Options {
                listen,
                allow_unlock,
                allow_hosts: allow_host,
                pattern,
                interval,
            };
            console::serve(locks, options).await
        }
    }
}

/// Whether a lock is taken: held, or done and kept for its minimum hold.
fn taken(info: &LockInfo) -> bool {
    info.is_held() || info.kept.is_some()
}

/// The locks named `key`: of `kind`, or of every kind that is taken.
async fn find(
    locks: &LockService,
    key: &str,
    kind: Option<LockKind>,
) -> Result<Vec<LockInfo>, LockError> {
    match kind {
        Some(kind) => Ok(vec![locks.inspect_kind(kind, key).await?]),
        None => {
            let mut held = Vec::new();
            for kind in LockKind::ALL {
                let info = locks.inspect_kind(kind, key).await?;
                if taken(&info) {
                    held.push(info);
                }
            }
            Ok(held)
        }
    }
}

async fn show(
    locks: &LockService,
    key: &str,
    kind: Option<LockKind>,
    json: bool,
) -> Result<(), Failure> {
    let found = find(locks, key, kind).await?;
    let shown = render::text(key);
    let mut out = String::new();
    for info in &found {
        if json {
            out.push_str(&render::json(info).to_string());
            out.push('\n');
        } else {
            out.push_str(&render::detail(info));
        }
    }
    print!("{out}");
    if found.iter().any(taken) {
        return Ok(());
    }
    if !json {
        match kind {
            Some(kind) => println!("{} `{shown}` is not held", kind.noun()),
            None => println!(
                "no lock `{shown}` is held (looked at the mutex, the read-write lock and the \
                 semaphore `{shown}`)"
            ),
        }
    }
    Err(Failure::NotFound)
}

async fn watch(
    locks: &LockService,
    pattern: Option<&str>,
    interval: Duration,
) -> Result<(), Failure> {
    let tty = std::io::stdout().is_terminal();
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            _ = ticks.tick() => {}
        }
        let body = match locks.list(pattern).await {
            Ok(list) => format!(
                "{} lock{} held\n\n{}",
                list.len(),
                if list.len() == 1 { "" } else { "s" },
                render::table(&list)
            ),
            // a watch outlives a failover or a restart of Redis: say so and keep going
            Err(e) => format!("error: {}\n", render::message(&e.to_string())),
        };
        let header = format!(
            "lockctl watch: {} at {} UTC, every {} (Ctrl-C to stop)",
            locks.config().topology().mode(),
            render::clock(std::time::SystemTime::now()),
            render::duration(interval),
        );
        let mut out = std::io::stdout().lock();
        // on a terminal redraw in place; piped, one block per refresh
        let clear = if tty { "\x1b[H\x1b[2J" } else { "" };
        let _ = write!(out, "{clear}{header}\n{body}\n");
        let _ = out.flush();
    }
}

async fn unlock(
    locks: &LockService,
    key: &str,
    kind: Option<LockKind>,
    yes: bool,
) -> Result<(), Failure> {
    let found: Vec<LockInfo> = find(locks, key, kind)
        .await?
        .into_iter()
        .filter(taken)
        .collect();
    let shown = render::text(key);
    let target = match &found[..] {
        [] => {
            match kind {
                Some(kind) => {
                    println!("nothing removed: {} `{shown}` is not held", kind.noun())
                }
                None => println!("nothing removed: no lock `{shown}` is held"),
            }
            return Err(Failure::NotFound);
        }
        [one] => one,
        several => {
            let kinds: Vec<&str> = several.iter().map(|i| i.kind.as_str()).collect();
            return Err(Failure::Usage(format!(
                "`{key}` names held locks of several kinds ({}): pass --kind",
                kinds.join(", ")
            )));
        }
    };
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(Failure::Usage(
                "refusing to force-unlock without confirmation: stdin is not a terminal; pass \
                 --yes to unlock anyway"
                    .to_owned(),
            ));
        }
        print!("{}", render::detail(target));
        print!(
            "Force-unlock the {} `{shown}`? Its holders lose it. [y/N] ",
            target.kind.noun()
        );
        let _ = std::io::stdout().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            println!("nothing removed");
            return Err(Failure::NotFound);
        }
    }
    match locks.force_unlock_kind(target.kind, key).await? {
        Some(removed) => {
            print!("{}", render::removed(&removed));
            Ok(())
        }
        None => {
            println!(
                "nothing removed: the {} `{shown}` was released meanwhile",
                target.kind.noun()
            );
            Err(Failure::NotFound)
        }
    }
}
