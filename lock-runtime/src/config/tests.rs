use super::file::parse_duration;
use super::*;

fn err(text: &str) -> String {
    let e = LockConfig::from_toml_str(text).unwrap_err();
    assert!(e.is_config(), "{e:?}");
    e.to_string()
}

#[test]
fn parses_single_with_defaults() {
    let c =
        LockConfig::from_toml_str("[redis]\nmode = \"single\"\nurl = \"redis://h:1\"\n").unwrap();
    assert_eq!(
        c.topology(),
        &Topology::Single {
            url: "redis://h:1".into()
        }
    );
    assert_eq!(c.prefix(), "lock:");
    assert_eq!(c.watchdog_timeout(), Duration::from_secs(30));
    assert_eq!(c.default_wait(), DefaultWait::For(Duration::from_secs(3)));
    assert_eq!(c.fence_idle_ttl(), Some(Duration::from_secs(300)));
}

#[test]
fn fence_idle_ttl_is_a_duration_or_never() {
    let base = "[redis]\nmode = \"single\"\nurl = \"x\"\n[lock]\n";
    let c = LockConfig::from_toml_str(&format!("{base}fence_idle_ttl = \"never\"\n")).unwrap();
    assert_eq!(c.fence_idle_ttl(), None);
    let c = LockConfig::from_toml_str(&format!("{base}fence_idle_ttl = \"2h\"\n")).unwrap();
    assert_eq!(c.fence_idle_ttl(), Some(Duration::from_secs(7200)));
    let e = err(&format!("{base}fence_idle_ttl = \"10s\"\n"));
    assert!(
        e.contains("`lock.fence_idle_ttl`") && e.contains("1m"),
        "{e}"
    );
    let e = err(&format!("{base}fence_idle_ttl = \"soon\"\n"));
    assert!(
        e.contains("`lock.fence_idle_ttl`") && e.contains("never"),
        "{e}"
    );
}

#[test]
fn parses_every_mode() {
    let c = LockConfig::from_toml_str(
        "[redis]\nmode = \"cluster\"\nnodes = [\"redis://a:1\", \"redis://b:2\"]\n\
         [lock]\nprefix = \"p:\"\nwatchdog_timeout = \"9s\"\ndefault_wait = \"forever\"\n",
    )
    .unwrap();
    assert_eq!(c.topology().mode(), "cluster");
    assert_eq!(c.default_wait(), DefaultWait::Forever);
    let c = LockConfig::from_toml_str(
        "[redis]\nmode = \"sentinel\"\nmaster_name = \"m\"\nsentinels = [\"redis://s:1\"]\n",
    )
    .unwrap();
    assert_eq!(c.topology().mode(), "sentinel");
    let c = LockConfig::from_toml_str(
        "[redis]\nmode = \"master-slave\"\nmaster = \"redis://m:1\"\nreplicas = [\"redis://r:1\"]\n\
         response_timeout = \"250ms\"\n",
    )
    .unwrap();
    assert_eq!(c.response_timeout(), Duration::from_millis(250));
}

#[test]
fn errors_name_field_and_expectation() {
    let e = err("[redis]\nmode = \"single\"\n");
    assert!(e.contains("`redis.url`") && e.contains("requires"), "{e}");
    let e = err("[redis]\nmode = \"raft\"\nurl = \"x\"\n");
    assert!(e.contains("`redis.mode`") && e.contains("\"raft\""), "{e}");
    let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\n[lock]\nwatchdog_timeout = \"30 sec\"\n");
    assert!(
        e.contains("`lock.watchdog_timeout`") && e.contains("\"5s\""),
        "{e}"
    );
    assert!(e.contains("line 5"), "{e}");
    let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\nurll = \"y\"\n");
    assert!(e.contains("urll") && e.contains("expected one of"), "{e}");
    let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\nnodes = [\"y\"]\n");
    assert!(
        e.contains("`redis.nodes`") && e.contains("does not apply"),
        "{e}"
    );
    let e = err("[redis]\nmode = \"cluster\"\nnodes = []\n");
    assert!(e.contains("`redis.nodes`"), "{e}");
    let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\n[lock]\nprefix = \"a{b\"\n");
    assert!(
        e.contains("`lock.prefix`") && e.contains("<config string>"),
        "{e}"
    );
    let e = err("redis = 3");
    assert!(e.contains("`redis`"), "{e}");
    let e = err("[lock]\nprefix = \"x\"\n");
    assert!(e.contains("[redis]"), "{e}");
    let e = err("[redis]\nmode = \"single\"\nurl = \"x\"\nsync_replicas = 1\n");
    assert!(
        e.contains("`redis.sync_replicas`") && e.contains("single"),
        "{e}"
    );
    let e = err("[redis]\nmode = \"master-slave\"\nmaster = \"x\"\nsync_replicas = -1\n");
    assert!(e.contains("`redis.sync_replicas`"), "{e}");
}

#[test]
fn file_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("lockcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lock.toml");
    std::fs::write(&path, "[redis]\nmode = \"single\"\n").unwrap();
    let e = LockConfig::from_file(&path).unwrap_err().to_string();
    assert!(e.contains("lock.toml") && e.contains("`redis.url`"), "{e}");
    let e = LockConfig::from_file(dir.join("missing.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.toml"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

const TLS_SINGLE: &str = "[redis]\nmode = \"single\"\nurl = \"rediss://h:1\"\n";

#[test]
fn tls_files_are_read_from_the_table() {
    let text = format!(
        "{TLS_SINGLE}[redis.tls]\nca_file = \"/etc/ca.pem\"\ncert_file = \"c.pem\"\n\
         key_file = \"c.key\"\n"
    );
    let parsed = LockConfig::from_toml_str(&text);
    if !cfg!(feature = "tls") {
        let e = parsed.unwrap_err().to_string();
        assert!(
            e.contains("`tls` feature") && e.contains("`redis.url`"),
            "{e}"
        );
        return;
    }
    let c = parsed.unwrap();
    assert!(c.uses_tls());
    let tls = c.tls().unwrap();
    assert_eq!(tls.ca_file(), Some(Path::new("/etc/ca.pem")));
    // no file: relative to the working directory
    assert_eq!(tls.cert_file(), Some(Path::new("c.pem")));
    assert_eq!(tls.key_file(), Some(Path::new("c.key")));
    // a rediss:// URL alone: the system's roots, no client certificate
    let c = LockConfig::from_toml_str(TLS_SINGLE).unwrap();
    assert!(c.uses_tls() && c.tls().is_none());
}

#[test]
fn tls_paths_in_a_file_are_relative_to_it() {
    if !cfg!(feature = "tls") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("lockcfg-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lock.toml");
    std::fs::write(
        &path,
        format!("{TLS_SINGLE}[redis.tls]\nca_file = \"certs/ca.pem\"\n"),
    )
    .unwrap();
    let c = LockConfig::from_file(&path).unwrap();
    assert_eq!(
        c.tls().unwrap().ca_file(),
        Some(dir.join("certs/ca.pem").as_path())
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tls_mistakes_name_the_field() {
    let e = err(&format!("{TLS_SINGLE}[redis.tls]\ncert_file = \"c.pem\"\n"));
    assert!(e.contains("`redis.tls.key_file`"), "{e}");
    let e = err(&format!("{TLS_SINGLE}[redis.tls]\nkey_file = \"c.key\"\n"));
    assert!(e.contains("`redis.tls.cert_file`"), "{e}");
    let e = err(&format!(
        "{TLS_SINGLE}[redis.tls]\ninsecure_skip_verify = true\n"
    ));
    assert!(e.contains("insecure_skip_verify"), "{e}");
    // TLS files with a plaintext URL: nothing would use them
    let e =
        err("[redis]\nmode = \"single\"\nurl = \"redis://h:1\"\n[redis.tls]\nca_file = \"a\"\n");
    assert!(e.contains("`redis.tls`") && e.contains("rediss://"), "{e}");
    // one scheme for every URL
    let e = err("[redis]\nmode = \"cluster\"\nnodes = [\"rediss://a:1\", \"redis://b:2\"]\n");
    assert!(
        e.contains("`redis.nodes`") && e.contains("redis://b:2"),
        "{e}"
    );
    // certificate checks are not switched off
    let e = err("[redis]\nmode = \"single\"\nurl = \"rediss://h:1/#insecure\"\n");
    assert!(e.contains("#insecure") && e.contains("ca_file"), "{e}");
    // the builder gets the same checks, at connect
    let c = LockConfig::single("redis://h:1").with_tls(TlsConfig::new().with_ca_file("a"));
    assert!(c.validate().unwrap_err().is_config());
}

#[test]
fn debug_shows_tls_paths_and_no_secret() {
    let c = LockConfig::single("rediss://app:url-secret@h:1")
        .with_credentials(Some("app".into()), Some("pw-secret".into()))
        .with_tls(
            TlsConfig::new()
                .with_ca_file("/etc/lock/ca.pem")
                .with_client_cert("/etc/lock/client.pem", "/etc/lock/client.key"),
        );
    let text = format!("{c:?}");
    assert!(
        !text.contains("url-secret") && !text.contains("pw-secret"),
        "{text}"
    );
    for path in [
        "/etc/lock/ca.pem",
        "/etc/lock/client.pem",
        "/etc/lock/client.key",
    ] {
        assert!(text.contains(path), "{text}");
    }
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("ms").is_err());
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("99999999999999999h").is_err());
}

const SINGLE: &str = "[redis]\nmode = \"single\"\nurl = \"redis://h:1\"\n";

/// `field = "value"` in its table of a single-mode file.
fn file_with(field: &str, value: &str) -> String {
    match field.split_once('.') {
        Some(("redis", name)) => format!("{SINGLE}{name} = \"{value}\"\n"),
        Some(("lock", name)) => format!("{SINGLE}[lock]\n{name} = \"{value}\"\n"),
        _ => unreachable!("{field}"),
    }
}

/// The same value set through the builders.
fn built_with(field: &str, value: &str) -> LockConfig {
    let c = LockConfig::single("redis://h:1");
    if field == "lock.default_wait" && value == "forever" {
        return c.with_default_wait(DefaultWait::Forever);
    }
    let d = parse_duration(value).unwrap();
    match field {
        "redis.connect_timeout" => c.with_connect_timeout(d),
        "redis.response_timeout" => c.with_response_timeout(d),
        "redis.sync_timeout" => c.with_sync_replicas(0, d),
        "lock.watchdog_timeout" => c.with_watchdog_timeout(d),
        "lock.default_wait" => c.with_default_wait(DefaultWait::For(d)),
        "lock.fence_idle_ttl" => c.with_fence_idle_ttl(Some(d)),
        _ => unreachable!("{field}"),
    }
}

/// Every duration, its allowed range as the message writes it, the values just inside and
/// (where there is one) just outside each end.
const DURATION_BOUNDS: [(&str, &str, &[&str], &[&str]); 6] = [
    (
        "redis.connect_timeout",
        "1ms to 1h",
        &["1ms", "1h"],
        &["0ms", "3600001ms"],
    ),
    (
        "redis.response_timeout",
        "1ms to 1h",
        &["1ms", "1h"],
        &["0ms", "3600001ms"],
    ),
    (
        "redis.sync_timeout",
        "1ms to 1h",
        &["1ms", "1h"],
        &["0ms", "3600001ms"],
    ),
    (
        "lock.watchdog_timeout",
        "30ms to 3650d",
        &["30ms", "3650d"],
        &["29ms", "3651d", "99999d"],
    ),
    (
        "lock.default_wait",
        "0ms to 365d",
        &["0ms", "365d", "forever"],
        &["366d", "99999d"],
    ),
    (
        "lock.fence_idle_ttl",
        "1m to 3650d",
        &["1m", "3650d"],
        &["59999ms", "3651d"],
    ),
];

#[test]
fn every_duration_is_range_checked_in_files_and_builders() {
    for (field, range, inside, outside) in DURATION_BOUNDS {
        for value in inside {
            if let Err(e) = LockConfig::from_toml_str(&file_with(field, value)) {
                panic!("{field} = {value:?} must load: {e}");
            }
            if let Err(e) = built_with(field, value).validate() {
                panic!("{field} = {value:?} must pass validate: {e}");
            }
        }
        for value in outside {
            for e in [
                LockConfig::from_toml_str(&file_with(field, value)).err(),
                built_with(field, value).validate().err(),
            ] {
                let e = e.unwrap_or_else(|| panic!("{field} = {value:?} must be refused"));
                assert!(e.is_config(), "{e:?}");
                let text = e.to_string();
                assert!(
                    text.contains(&format!("`{field}`")) && text.contains(range),
                    "{field} = {value:?}: {text}"
                );
                assert!(text.contains(value), "{field} = {value:?}: {text}");
            }
        }
    }
}

/// Everything an error shows: its message, its `Debug`, and both of every source below it.
fn every_text(e: &LockError) -> String {
    let mut text = format!("{e}\n{e:?}\n");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    text
}

#[test]
fn a_mistake_in_the_file_does_not_print_its_secrets() {
    let secret = "s3cret-pw";
    let with_password = format!("{SINGLE}password = \"{secret}\"\n");
    for (text, says) in [
        // not TOML: a duration without quotes
        (format!("{with_password}response_timeout = 3s\n"), "line 5"),
        // a typo in a field name
        (
            format!("{with_password}respons_timeout = \"3s\"\n"),
            "line 5",
        ),
        // a typo in the password's own field name
        (format!("{SINGLE}pasword = \"{secret}\"\n"), "pasword"),
        // a wrong value type
        (
            format!("{with_password}sync_replicas = \"one\"\n"),
            "line 5",
        ),
    ] {
        let e = LockConfig::from_toml_str(&text).unwrap_err();
        assert!(e.is_config(), "{e:?}");
        assert!(e.to_string().contains(says), "{e}");
        let shown = every_text(&e);
        assert!(!shown.contains(secret), "{shown}");
    }
    // a password that is not a string is not shown either
    let e = LockConfig::from_toml_str(&format!("{SINGLE}password = 8675309\n")).unwrap_err();
    assert!(e.to_string().contains("`redis.password`"), "{e}");
    let shown = every_text(&e);
    assert!(!shown.contains("8675309"), "{shown}");
}

#[test]
fn urls_are_shown_without_secrets() {
    for (url, shown) in [
        ("redis://h:1", "redis://h:1"),
        ("redis://app:pw@h:1/0", "redis://app:***@h:1/0"),
        ("redis://:pw@h:1", "redis://:***@h:1"),
        ("redis://pw@h:1", "redis://***@h:1"),
        (
            "rediss://app:p%40ss@h:1/#insecure",
            "rediss://app:***@h:1/#insecure",
        ),
        (
            "redis://h:1/?password=pw&protocol=resp3",
            "redis://h:1/?password=***&protocol=resp3",
        ),
        (
            "redis://u:pw@h:1/2?Pass=pw&auth=pw&token=pw&db=2",
            "redis://u:***@h:1/2?Pass=***&auth=***&token=***&db=2",
        ),
        // an `@` in the query is not the end of a user name
        ("redis://h:1/?token=a@b", "redis://h:1/?token=***"),
    ] {
        assert_eq!(redacted(url), shown, "{url}");
    }
    let c = LockConfig::new(Topology::Cluster {
        nodes: vec!["redis://u:s3cret-pw@127.0.0.1:1/?password=s3cret-pw".into()],
    });
    assert!(!format!("{c:?}").contains("s3cret-pw"), "{c:?}");
    let topology = format!("{:?}", c.topology());
    assert!(!topology.contains("s3cret-pw"), "{topology}");
    assert!(topology.contains("u:***@127.0.0.1:1"), "{topology}");
}

#[test]
fn a_url_secret_stays_out_of_connect_errors() {
    let url = "redis://u:s3cret-pw@127.0.0.1:1/?password=s3cret-pw";
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for config in [
        LockConfig::single(url),
        LockConfig::new(Topology::MasterSlave {
            master: url.into(),
            replicas: vec![url.into()],
        }),
        LockConfig::new(Topology::Cluster {
            nodes: vec![url.into()],
        }),
        LockConfig::new(Topology::Sentinel {
            master_name: "m".into(),
            sentinels: vec![url.into()],
        }),
    ] {
        let config = config
            .with_connect_timeout(Duration::from_millis(500))
            .with_response_timeout(Duration::from_millis(500));
        let e = runtime
            .block_on(crate::LockService::connect(config))
            .expect_err("nothing listens on port 1");
        let shown = every_text(&e);
        assert!(!shown.contains("s3cret-pw"), "{shown}");
        assert!(shown.contains("127.0.0.1:1"), "{shown}");
    }
}

/// An application's settings with the lock configuration as one of its values.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct AppSettings {
    listen: String,
    locks: LockConfig,
}

fn nested(locks: &str) -> Result<LockConfig, String> {
    toml::from_str::<AppSettings>(&format!("listen = \"0.0.0.0:80\"\n{locks}"))
        .map(|s| s.locks)
        .map_err(|e| e.to_string())
}

#[test]
fn nested_in_an_applications_settings_with_the_same_checks() {
    let c = nested(
        "[locks.redis]\nmode = \"cluster\"\nnodes = [\"redis://a:1\", \"redis://b:2\"]\n\
         [locks.lock]\nprefix = \"shop:\"\nwatchdog_timeout = \"10s\"\n",
    )
    .unwrap();
    assert_eq!(
        c.topology(),
        &Topology::Cluster {
            nodes: vec!["redis://a:1".into(), "redis://b:2".into()]
        }
    );
    assert_eq!(c.prefix(), "shop:");
    assert_eq!(c.watchdog_timeout(), Duration::from_secs(10));
    assert_eq!(c, LockConfig::from_toml_str(TOML_OF_NESTED).unwrap());

    // the file's messages: the field, what was expected
    let e = nested("[locks.redis]\nmode = \"single\"\n").unwrap_err();
    assert!(
        e.contains("`redis.url`") && e.contains("requires it"),
        "{e}"
    );
    let e = nested("[locks.redis]\nmode = \"single\"\nurl = \"redis://h:1\"\nnodes = [\"x\"]\n")
        .unwrap_err();
    assert!(
        e.contains("`redis.nodes`") && e.contains("does not apply"),
        "{e}"
    );
    let e = nested(
        "[locks.redis]\nmode = \"single\"\nurl = \"redis://h:1\"\nconnect_timeout = \"5 s\"\n",
    )
    .unwrap_err();
    assert!(e.contains("connect_timeout") || e.contains("5 s"), "{e}");
    let e =
        nested("[locks.redis]\nmode = \"single\"\nurl = \"redis://h:1\"\nbogus = 1\n").unwrap_err();
    assert!(e.contains("bogus"), "{e}");
    let e = nested("[locks.lock]\nwatchdog_timeout = \"1ms\"\n[locks.redis]\nmode = \"single\"\nurl = \"redis://h:1\"\n")
        .unwrap_err();
    assert!(e.contains("watchdog_timeout") && e.contains("30ms"), "{e}");
    // a password of the wrong type is not quoted by this crate's message (the application's
    // deserializer may still show the line of its document: toml's errors do)
    let e = nested("[locks.redis]\nmode = \"single\"\nurl = \"redis://h:1\"\npassword = 8675309\n")
        .unwrap_err();
    assert!(
        e.contains("expected a string (the value is not shown)") && !e.contains("`8675309`"),
        "{e}"
    );
}

const TOML_OF_NESTED: &str = "[redis]\nmode = \"cluster\"\nnodes = [\"redis://a:1\", \"redis://b:2\"]\n\
     [lock]\nprefix = \"shop:\"\nwatchdog_timeout = \"10s\"\n";

/// Runs the test `name` again in a process of its own with `vars` set (the environment is the
/// process's: tests of one process must not change it under each other); returns `true` in
/// that process, where the test then does its checks.
fn in_own_process(name: &str, vars: &[(&str, &str)]) -> bool {
    if std::env::var_os("LOCK_CONFIG_TEST_CHILD").is_some() {
        return true;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads", "1"])
        .env("LOCK_CONFIG_TEST_CHILD", "1")
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the test did not run: {text}");
    false
}

#[test]
fn the_environment_replaces_addresses_and_prefix() {
    if !in_own_process(
        "config::tests::the_environment_replaces_addresses_and_prefix",
        &[
            ("LOCK_REDIS_URL", "redis://from-env:7000"),
            ("LOCK_PREFIX", "env:"),
        ],
    ) {
        return;
    }
    let c = LockConfig::from_toml_str(
        "[redis]\nmode = \"single\"\nurl = \"redis://from-file:6379\"\n[lock]\nprefix = \"file:\"\n",
    )
    .unwrap();
    assert_eq!(
        c.topology(),
        &Topology::Single {
            url: "redis://from-env:7000".into()
        }
    );
    assert_eq!(c.prefix(), "env:");
    // the file may leave the address out when the environment gives it
    let c = LockConfig::from_toml_str("[redis]\nmode = \"single\"\n").unwrap();
    assert_eq!(c.prefix(), "env:");
    // nested settings too
    assert_eq!(
        nested("[locks.redis]\nmode = \"single\"\n")
            .unwrap()
            .topology(),
        c.topology()
    );
    // a variable of another mode is named
    let e = err("[redis]\nmode = \"cluster\"\nnodes = [\"redis://a:1\"]\n");
    assert!(
        e.contains("`redis.url` (from $LOCK_REDIS_URL)") && e.contains("does not apply"),
        "{e}"
    );
    // no mode in the environment: from_env says so
    let e = LockConfig::from_env().unwrap_err();
    assert!(e.to_string().contains("LOCK_REDIS_MODE"), "{e}");
}

#[test]
fn a_configuration_from_the_environment_alone() {
    if !in_own_process(
        "config::tests::a_configuration_from_the_environment_alone",
        &[
            ("LOCK_REDIS_MODE", "sentinel"),
            ("LOCK_REDIS_MASTER_NAME", "mymaster"),
            ("LOCK_REDIS_SENTINELS", "redis://s1:26379, redis://s2:26379"),
        ],
    ) {
        return;
    }
    let c = LockConfig::from_env().unwrap();
    assert_eq!(
        c.topology(),
        &Topology::Sentinel {
            master_name: "mymaster".into(),
            sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
        }
    );
    assert_eq!(c.prefix(), "lock:");
}
