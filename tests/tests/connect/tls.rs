//! TLS: every topology with its servers speaking TLS only (`port 0`, `tls-port`; servers check
//! client certificates; replication, the cluster bus and the sentinels over TLS too), with
//! certificates made at run time. The locks work there, mutual exclusion holds under
//! contention, and wake-ups arrive; and the mistakes - a CA that did not sign the server's
//! certificate, an expired server or client certificate, no client certificate, a plaintext
//! client at a TLS port and a TLS client at a plaintext port - are clear errors that name the
//! server and are not retryable, well before `connect_timeout`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::common::Fixture;
use lock_runtime::{ErrorKind, LockConfig, LockError, LockService, TlsConfig};
use lock_tests::harness::{Kind, Pki, Spec, Validity, unique_key};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Lock and unlock, then tasks of two services take turns on one key: the count of critical
/// sections adds up and no two overlap (waiters are woken by release messages over TLS).
async fn locks_and_contention(config: impl Fn() -> LockConfig) {
    let a = LockService::connect(config())
        .await
        .expect("connect over TLS");
    let b = LockService::connect(config())
        .await
        .expect("connect over TLS");
    let key = unique_key("tls");
    let held = a.lock(&key).await.unwrap();
    let busy = b.try_lock(&key).await.unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Timeout, "{busy}");
    assert!(b.is_locked(&key).await.unwrap());
    held.release().await.unwrap();
    assert!(!a.is_locked(&key).await.unwrap());

    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU32::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for service in [a.clone(), b.clone()] {
        for _ in 0..3 {
            let (service, key) = (service.clone(), key.clone());
            let (inside, done) = (inside.clone(), done.clone());
            tasks.spawn(async move {
                for _ in 0..8 {
                    let guard = service
                        .lock(&key)
                        .wait(Duration::from_secs(10))
                        .await
                        .unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.store(false, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 2 * 3 * 8);
}

fn assert_tls_error(err: &LockError, port: u16, what: &str, started: Instant) {
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(!err.is_retryable(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{port}")),
        "names the server: {text}"
    );
    assert!(text.contains(what), "says `{what}`: {text}");
    assert!(
        started.elapsed() < CONNECT_TIMEOUT / 2,
        "fails at once, not at connect_timeout: {:?}",
        started.elapsed()
    );
}

fn with_timeout(config: LockConfig) -> LockConfig {
    config.with_connect_timeout(CONNECT_TIMEOUT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_over_tls() {
    let fx = Fixture::own_tls(Spec::Single, Pki::new()).await;
    assert!(
        fx.topo().url().starts_with("rediss://"),
        "{}",
        fx.topo().url()
    );
    locks_and_contention(|| with_timeout(fx.config(Duration::from_secs(30)))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_slave_over_tls_with_replica_acknowledgements() {
    let fx = Fixture::own_tls(Spec::master_replicas(), Pki::new()).await;
    assert_eq!(fx.kind(), Kind::MasterReplicas);
    locks_and_contention(|| {
        with_timeout(fx.config(Duration::from_secs(30)))
            .with_sync_replicas(2, Duration::from_secs(1))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_with_replica_acknowledgements() {
    let fx = Fixture::own_tls(Spec::sentinel(), Pki::new()).await;
    locks_and_contention(|| {
        with_timeout(fx.config(Duration::from_secs(30)))
            .with_sync_replicas(1, Duration::from_secs(1))
    })
    .await;

    // trusting another CA: the sentinels are refused first, and named
    let pki = fx.topo().tls().unwrap();
    let config = with_timeout(fx.config(Duration::from_secs(30)))
        .with_tls(pki.lock_tls().with_ca_file(pki.foreign_ca_file()));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    let sentinels = fx.topo().sentinel_ports();
    let named = sentinels
        .iter()
        .find(|&&p| err.to_string().contains(&format!("127.0.0.1:{p}")));
    assert_tls_error(
        &err,
        *named.unwrap_or(&sentinels[0]),
        "not signed by a CA",
        started,
    );

    // plaintext URLs for TLS-only sentinels
    let config = with_timeout(LockConfig::new(lock_runtime::Topology::Sentinel {
        master_name: fx.topo().master_name().to_owned(),
        sentinels: plaintext(&sentinels),
    }));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_tls_error(&err, sentinels[0], "write rediss://", started);
}

/// `redis://` URLs of `ports`.
fn plaintext(ports: &[u16]) -> Vec<String> {
    ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls() {
    let fx = Fixture::own_tls(Spec::cluster(), Pki::new()).await;
    locks_and_contention(|| with_timeout(fx.config(Duration::from_secs(30)))).await;

    // trusting another CA: the seed nodes are named
    let pki = fx.topo().tls().unwrap();
    let config = with_timeout(fx.config(Duration::from_secs(30)))
        .with_tls(pki.lock_tls().with_ca_file(pki.foreign_ca_file()));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_tls_error(
        &err,
        fx.topo().node_ports()[0],
        "not signed by a CA",
        started,
    );

    // plaintext URLs for TLS-only nodes
    let nodes = fx.topo().node_ports();
    let config = with_timeout(LockConfig::new(lock_runtime::Topology::Cluster {
        nodes: plaintext(&nodes),
    }));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_tls_error(&err, nodes[0], "write rediss://", started);
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_a_tls_error_naming_the_server() {
    let fx = Fixture::own_tls(Spec::Single, Pki::new()).await;
    let pki = fx.topo().tls().unwrap();
    let config = with_timeout(fx.config(Duration::from_secs(30)))
        .with_tls(pki.lock_tls().with_ca_file(pki.foreign_ca_file()));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_tls_error(&err, fx.topo().master_port(), "not signed by a CA", started);
}

#[tokio::test]
async fn an_expired_server_certificate_is_a_tls_error() {
    let fx = Fixture::own_tls(Spec::Single, Pki::with_server(Validity::Expired)).await;
    let started = Instant::now();
    let err = LockService::connect(with_timeout(fx.config(Duration::from_secs(30))))
        .await
        .unwrap_err();
    assert_tls_error(&err, fx.topo().master_port(), "has expired", started);
}

#[tokio::test]
async fn an_expired_client_certificate_is_a_tls_error() {
    let fx = Fixture::own_tls(Spec::Single, Pki::new()).await;
    let pki = fx.topo().tls().unwrap();
    let (cert, key) = pki.issue_client(Validity::Expired);
    let config = with_timeout(fx.config(Duration::from_secs(30))).with_tls(
        TlsConfig::new()
            .with_ca_file(pki.ca_file())
            .with_client_cert(cert, key),
    );
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_tls_error(&err, fx.topo().master_port(), "as expired", started);
}

#[tokio::test]
async fn no_client_certificate_for_a_server_that_checks_clients_is_a_tls_error() {
    let fx = Fixture::own_tls(Spec::Single, Pki::new()).await;
    let pki = fx.topo().tls().unwrap();
    let config = with_timeout(fx.config(Duration::from_secs(30)))
        .with_tls(TlsConfig::new().with_ca_file(pki.ca_file()));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_tls_error(
        &err,
        fx.topo().master_port(),
        "refused this client's certificate",
        started,
    );
}

#[tokio::test]
async fn a_plaintext_client_at_a_tls_only_server_is_a_clear_error() {
    let fx = Fixture::own_tls(Spec::Single, Pki::new()).await;
    let port = fx.topo().master_port();
    let config = with_timeout(LockConfig::single(format!("redis://127.0.0.1:{port}")));
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_tls_error(&err, port, "rediss://", started);
}

#[tokio::test]
async fn a_tls_client_at_a_plaintext_server_is_a_clear_error() {
    let fx = Fixture::shared(Kind::Single).await;
    let port = fx.topo().master_port();
    let pki = Pki::new();
    let config = with_timeout(LockConfig::single(format!("rediss://127.0.0.1:{port}")))
        .with_tls(pki.lock_tls());
    let started = Instant::now();
    let err = LockService::connect(config).await.unwrap_err();
    assert_tls_error(&err, port, "does not answer in TLS", started);
}

/// Key material never shows: not in the error about a key file that holds no key, not in the
/// error of a refused handshake, not in the configuration's `Debug` (which shows the paths).
#[tokio::test]
async fn key_material_never_shows_in_errors_or_debug_output() {
    let fx = Fixture::own_tls(Spec::Single, Pki::new()).await;
    let pki = fx.topo().tls().unwrap();
    let (cert, key) = pki.issue_client(Validity::Expired);
    let key_text = std::fs::read_to_string(&key).unwrap();
    let body: Vec<&str> = key_text
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 8)
        .collect();
    assert!(!body.is_empty());
    let secret_free = |text: &str| body.iter().all(|line| !text.contains(line));

    let config = with_timeout(fx.config(Duration::from_secs(30))).with_tls(
        TlsConfig::new()
            .with_ca_file(pki.ca_file())
            .with_client_cert(&cert, &key),
    );
    let shown = format!("{config:?}");
    assert!(shown.contains(&key.display().to_string()), "{shown}");
    assert!(secret_free(&shown), "{shown}");
    let err = LockService::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    let shown = format!("{err} {err:?}");
    assert!(secret_free(&shown), "{shown}");

    // a key file with something else in it: named with its path, its contents not shown
    let not_a_key = pki.dir().join("not-a-key.pem");
    std::fs::write(&not_a_key, "SECRET-MATERIAL-7f3a\n").unwrap();
    let config = with_timeout(fx.config(Duration::from_secs(30))).with_tls(
        TlsConfig::new()
            .with_ca_file(pki.ca_file())
            .with_client_cert(&cert, &not_a_key),
    );
    let err = LockService::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("`redis.tls.key_file`"), "{shown}");
    assert!(shown.contains(&not_a_key.display().to_string()), "{shown}");
    assert!(!shown.contains("SECRET-MATERIAL"), "{shown}");

    // a missing CA file: named with its path
    let missing = pki.dir().join("missing-ca.pem");
    let config = with_timeout(fx.config(Duration::from_secs(30)))
        .with_tls(pki.lock_tls().with_ca_file(&missing));
    let err = LockService::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("`redis.tls.ca_file`"), "{err}");
    assert!(err.to_string().contains("missing-ca.pem"), "{err}");
}
