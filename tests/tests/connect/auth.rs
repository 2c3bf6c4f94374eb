//! Credentials: a server with `requirepass` and an ACL user. Right credentials (from the
//! config or `$LOCK_REDIS_*`) lock; wrong ones are an `Auth` error that names the user, never
//! the password, and is not retryable; a user without the permissions the locks need too.

use std::time::Duration;

use crate::common::{Fixture, eventually, waiters_in_line};
use lock_runtime::{ErrorKind, LockConfig, LockService};
use lock_tests::harness::{Spec, unique_key};

const PASSWORD: &str = "s3cret-Pw";

async fn secured() -> Fixture {
    let fx = Fixture::own(Spec::Single).await;
    let mut con = fx.redis();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(format!(">{PASSWORD}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query(&mut con)
        .unwrap();
    // a user that may log in but not run scripts
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("reader")
        .arg("on")
        .arg(format!(">{PASSWORD}"))
        .arg("~*")
        .arg("+@read")
        .arg("+hello")
        .arg("+ping")
        .arg("+client")
        .query(&mut con)
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("admin-pw")
        .query(&mut con)
        .unwrap();
    fx
}

fn config(fx: &Fixture, user: Option<&str>, password: Option<&str>) -> LockConfig {
    fx.config(Duration::from_secs(30))
        .with_connect_timeout(Duration::from_secs(2))
        .with_credentials(user.map(str::to_owned), password.map(str::to_owned))
}

#[tokio::test]
async fn the_right_credentials_lock_and_wrong_ones_are_an_auth_error() {
    let fx = secured().await;
    let locks = LockService::connect(config(&fx, Some("locker"), Some(PASSWORD)))
        .await
        .unwrap();
    let key = unique_key("auth");
    locks.lock(&key).await.unwrap().release().await.unwrap();

    for (user, password) in [
        (Some("locker"), Some("wrong-password")),
        (None, Some("wrong-password")),
        (None, None),
    ] {
        let err = LockService::connect(config(&fx, user, password))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Auth, "{user:?}: {err}");
        assert!(!err.is_retryable());
        let text = format!("{err} {err:?}");
        assert!(!text.contains("wrong-password"), "{text}");
        assert!(!text.contains(PASSWORD), "{text}");
        let who = user.map_or("the default user".to_owned(), |u| format!("user `{u}`"));
        assert!(err.to_string().contains(&who), "{err}");
    }
}

#[tokio::test]
async fn a_user_without_the_needed_permissions_is_an_auth_error() {
    let fx = secured().await;
    let outcome = match LockService::connect(config(&fx, Some("reader"), Some(PASSWORD))).await {
        Err(e) => e,
        Ok(locks) => locks.lock(unique_key("noperm")).await.unwrap_err(),
    };
    assert_eq!(outcome.kind(), ErrorKind::Auth, "{outcome}");
    assert!(outcome.to_string().contains("user `reader`"), "{outcome}");
}

#[tokio::test]
async fn credentials_come_from_the_environment_when_the_file_has_none() {
    let fx = secured().await;
    let dir = tempfile::tempdir().unwrap();
    let path = fx.config_file(dir.path(), Duration::from_secs(30), "");
    // each test runs in a process of its own under nextest; this one sets the variables before
    // anything reads them
    unsafe {
        std::env::set_var("LOCK_REDIS_USERNAME", "locker");
        std::env::set_var("LOCK_REDIS_PASSWORD", PASSWORD);
    }
    let config = LockConfig::from_file(&path).unwrap();
    unsafe {
        std::env::remove_var("LOCK_REDIS_USERNAME");
        std::env::remove_var("LOCK_REDIS_PASSWORD");
    }
    assert_eq!(config.username(), Some("locker"));
    assert!(!format!("{config:?}").contains(PASSWORD), "{config:?}");
    let locks = LockService::connect(config).await.unwrap();
    let key = unique_key("env");
    locks.lock(&key).await.unwrap().release().await.unwrap();
}

/// Everything an error shows: its message, its `Debug`, and both of every source below it.
fn every_text(err: &lock_runtime::LockError) -> String {
    let mut text = format!("{err}\n{err:?}\n");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        text.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    text
}

#[tokio::test]
async fn a_wrong_password_in_the_url_names_the_url_user_and_no_secret() {
    let fx = secured().await;
    let url = |password: &str| {
        fx.topo()
            .url()
            .replacen("redis://", &format!("redis://locker:{password}@"), 1)
            + &format!("/?password={password}")
    };
    let connect = |url: String| {
        LockService::connect(
            LockConfig::single(url)
                .with_watchdog_timeout(Duration::from_secs(30))
                .with_connect_timeout(Duration::from_secs(2)),
        )
    };
    // the credentials in the URL are the ones used
    let locks = connect(url(PASSWORD)).await.unwrap();
    let key = unique_key("url-auth");
    locks.lock(&key).await.unwrap().release().await.unwrap();

    let err = connect(url("wrong-s3cret")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(err.to_string().contains("user `locker`"), "{err}");
    assert!(!err.to_string().contains("default user"), "{err}");
    let text = every_text(&err);
    assert!(!text.contains("wrong-s3cret"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

/// Sets the password of the user `rotating` on every data node (only this one logs in).
fn set_password(fx: &Fixture, password: &str) {
    for port in fx.topo().node_ports() {
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("rotating")
            .arg("on")
            .arg("resetpass")
            .arg(format!(">{password}"))
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .query(&mut fx.topo().conn(port))
            .unwrap();
    }
}

/// Drops every connection of the user `rotating` on every data node.
fn kill_connections(fx: &Fixture) {
    for port in fx.topo().node_ports() {
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("USER")
            .arg("rotating")
            .query(&mut fx.topo().conn(port))
            .unwrap();
    }
}

/// A password rotation that went wrong and was put right: Redis refuses the service's password
/// when its connections come back (every call fails with `Auth`), then accepts it again. The
/// service recovers by itself, without a restart: locks are granted again, and a waiter in
/// another service is woken by a release (its subscription is back too).
async fn recovers_once_redis_accepts_the_password_again(spec: Spec) {
    let fx = Fixture::own(spec).await;
    set_password(&fx, "old-pw");
    let config = fx
        .config(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(1))
        .with_response_timeout(Duration::from_secs(1))
        .with_credentials(Some("rotating".to_owned()), Some("old-pw".to_owned()));
    let a = LockService::connect(config.clone()).await.unwrap();
    let b = LockService::connect(config).await.unwrap();
    let key = unique_key("rotate");
    a.lock(&key).await.unwrap().release().await.unwrap();

    set_password(&fx, "new-pw");
    kill_connections(&fx);
    // Auth errors (a cluster client keeps reconnecting each node inside a call: its calls end
    // at the response timeout, with Backend)
    let refused = if matches!(spec, Spec::Cluster { .. }) {
        ErrorKind::Backend
    } else {
        ErrorKind::Auth
    };
    eventually(
        "calls fail while Redis refuses the password",
        Duration::from_secs(10),
        || async {
            a.lock(&key)
                .wait(Duration::ZERO)
                .await
                .is_err_and(|e| e.kind() == refused)
        },
    )
    .await;

    set_password(&fx, "old-pw");
    let back = std::time::Instant::now();
    for service in [&a, &b] {
        eventually(
            "locks are granted again once Redis accepts the password",
            Duration::from_secs(10),
            || async {
                // (in a cluster, a call may first meet a connection the kill broke: Backend)
                match service.lock(&key).wait(Duration::ZERO).await {
                    Ok(guard) => {
                        guard.release().await.is_ok() && service.inspect(&key).await.is_ok()
                    }
                    Err(_) => false,
                }
            },
        )
        .await;
    }
    println!(
        "{spec:?}: granted again {:?} after the password was put back",
        back.elapsed()
    );

    // a waiter of another service is woken by the release, not by its timer (30 s lease)
    let held = a.lock(&key).lease(Duration::from_secs(30)).await.unwrap();
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.lock(&key).wait(Duration::from_secs(20)).await })
    };
    waiters_in_line(&b, &key, 1).await;
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the waiter was woken {:?} after the release",
        released.elapsed()
    );
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_recovers_once_it_accepts_the_password_again() {
    recovers_once_redis_accepts_the_password_again(Spec::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_mode_recovers_once_the_master_accepts_the_password_again() {
    recovers_once_redis_accepts_the_password_again(Spec::sentinel()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_recovers_once_it_accepts_the_password_again() {
    recovers_once_redis_accepts_the_password_again(Spec::cluster()).await;
}
