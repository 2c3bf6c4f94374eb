//! The global registry: explicit init, a second init, and lazy loading from `$LOCK_CONFIG` or
//! `./lock.toml`. One test, because the registry and the environment are process-wide (nextest
//! runs every test in a process of its own).

use crate::common::Fixture;
use lock_runtime::{ErrorKind, LockError, distributed_lock};
use lock_tests::harness::unique_key;

#[distributed_lock(key = "registry:<key>", wait = "1s")]
async fn locked(key: &str) -> Result<u64, LockError> {
    Ok(lock_runtime::current_fence().unwrap_or(0))
}

#[tokio::test]
async fn lazy_loading_explicit_init_and_reinit() {
    let fx = Fixture::single().await;
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    // SAFETY: this test runs in a process of its own (nextest); nothing else reads the environment.
    unsafe { std::env::remove_var(lock_runtime::CONFIG_ENV) };
    let key = unique_key("k");

    let err = locked(&key).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotInitialized);
    let msg = err.to_string();
    assert!(
        msg.contains("LOCK_CONFIG") && msg.contains("lock.toml") && msg.contains("init"),
        "{msg}"
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[redis]\nmode = \"cluster\"\n").unwrap();
    // SAFETY: as above.
    unsafe { std::env::set_var(lock_runtime::CONFIG_ENV, &bad) };
    let err = locked(&key).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(
        err.to_string().contains("bad.toml") && err.to_string().contains("redis.nodes"),
        "{err}"
    );

    // ./lock.toml is used when $LOCK_CONFIG is not set
    // SAFETY: as above.
    unsafe { std::env::remove_var(lock_runtime::CONFIG_ENV) };
    let text = format!(
        "[redis]\nmode = \"single\"\nurl = \"{}\"\n[lock]\nprefix = \"reg:\"\n",
        fx.topo().url()
    );
    std::fs::write(dir.path().join("lock.toml"), &text).unwrap();
    assert!(locked(&key).await.unwrap() > 0);
    let global = lock_runtime::try_global().expect("loaded on first use");
    assert_eq!(global.config().prefix(), "reg:");

    // the same settings again: fine; different settings: an error, never a silent replacement
    let same = lock_runtime::LockConfig::from_toml_str(&text).unwrap();
    assert!(lock_runtime::init(same).await.is_ok());
    let other = fx.config(std::time::Duration::from_secs(5));
    let err = lock_runtime::init(other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.to_string().contains("different configuration"), "{err}");
}
