//! The console's HTTP API: the state, unlock refused without `--allow-unlock`, and what keeps
//! other sites out: the `Host` (DNS rebinding), the `Origin`, the unlock token, `--allow-host`.

use std::time::Duration;

use lock_runtime::{ErrorKind, owner};
use lock_tests::harness::{Kind, unique_key};
use serde_json::Value;

use crate::{Fixture, find, http, serve, serve_on};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_api_without_allow_unlock() {
    let fx = Fixture::new(Kind::Single).await;
    let key = unique_key("api");
    let guard = owner::chain("req-7", async {
        fx.locks.lock(&key).lease(Duration::from_secs(30)).await
    })
    .await
    .unwrap();
    let (_serve, url) = serve(&fx.config, &[&format!("{key}*")]).await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let (status, body) = http(&url, "GET", "/api/state", None, &[], "").await;
    assert_eq!(status, 200, "{body}");
    let state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["allow_unlock"], false);
    let lock = find(state["locks"].as_array().unwrap(), "mutex", &key);
    assert_eq!(lock["holders"][0]["request_id"], "req-7");
    assert!(state["now_ms"].as_u64().unwrap() >= state["taken_ms"].as_u64().unwrap());

    // unlock is off: 403, and the lock stays
    let body = format!(r#"{{"kind":"mutex","key":"{key}"}}"#);
    let (status, answer) = http(&url, "POST", "/api/unlock", None, &[], &body).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("--allow-unlock"), "{answer}");
    assert!(fx.locks.is_locked(&key).await.unwrap());
    // another Host (a rebound DNS name) is refused
    let (status, _) = http(&url, "GET", "/api/state", Some("evil.example:80"), &[], "").await;
    assert_eq!(status, 421);
    // the page is served from the binary
    let (status, page) = http(&url, "GET", "/", None, &[], "").await;
    assert_eq!(status, 200);
    assert!(page.contains("/console.js"), "{page}");
    guard.release().await.unwrap();

    // a listen address that is none: a usage error
    let run = fx.lockctl(&["serve", "--listen", "not-an-address"]).await;
    assert_eq!(run.code, 2, "{run:?}");
}

/// The unlock token the console embedded in its page.
fn page_token(page: &str) -> String {
    let (_, rest) = page
        .split_once("<meta name=\"lockctl-token\" content=\"")
        .unwrap_or_else(|| panic!("no token in the page: {page}"));
    rest.split('"').next().unwrap().to_owned()
}

/// A page of another site whose host name was rebound to the console's address (DNS
/// rebinding) sends its own name as Host and Origin: it may neither read the locks nor unlock
/// one, also when the console listens on every address; nor may another origin, nor a request
/// without the page's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_refuses_rebound_hosts_other_origins_and_unlocks_without_token() {
    let fx = Fixture::new(Kind::Single).await;
    let key = unique_key("rebind");
    let guard = owner::chain("req-9", async {
        fx.locks.lock(&key).lease(Duration::from_secs(60)).await
    })
    .await
    .unwrap();
    let (_serve, listening) = serve_on(
        &fx.config,
        "0.0.0.0:0",
        &["--allow-unlock", &format!("{key}*")],
    )
    .await;
    let port = listening
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    // reached over loopback only
    let url = format!("http://127.0.0.1:{port}/");
    let body = format!(r#"{{"kind":"mutex","key":"{key}"}}"#);

    for host in ["evil.example".to_owned(), format!("evil.example:{port}")] {
        let origin = format!("http://{host}");
        for path in ["/api/state", "/"] {
            let (status, answer) = http(&url, "GET", path, Some(&host), &[], "").await;
            assert_eq!(status, 421, "GET {path} with Host {host}: {answer}");
            assert!(!answer.contains(&key), "{answer}");
        }
        let (status, answer) = http(
            &url,
            "POST",
            "/api/unlock",
            Some(&host),
            &[("Origin", &origin)],
            &body,
        )
        .await;
        assert_eq!(status, 421, "unlock with Host {host}: {answer}");
        assert!(answer.contains("Host"), "{answer}");
        assert!(
            fx.locks.is_locked(&key).await.unwrap(),
            "unlocked by {host}"
        );
    }

    // the console's own page carries the token
    let (status, page) = http(&url, "GET", "/", None, &[], "").await;
    assert_eq!(status, 200, "{page}");
    let token = page_token(&page);
    assert!(token.len() >= 32, "{token}");

    // a good Host, another origin: refused, even with the token
    let (status, answer) = http(
        &url,
        "POST",
        "/api/unlock",
        None,
        &[
            ("Origin", "http://evil.example"),
            ("X-Lockctl-Token", &token),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("evil.example"), "{answer}");
    // no token, a wrong one: refused
    let own_origin = format!("http://127.0.0.1:{port}");
    let wrong = "0".repeat(token.len());
    for headers in [
        vec![("Origin", own_origin.as_str())],
        vec![],
        vec![
            ("Origin", own_origin.as_str()),
            ("X-Lockctl-Token", wrong.as_str()),
        ],
    ] {
        let (status, answer) = http(&url, "POST", "/api/unlock", None, &headers, &body).await;
        assert_eq!(status, 403, "{headers:?}: {answer}");
        assert!(answer.contains("token"), "{answer}");
    }
    assert!(fx.locks.is_locked(&key).await.unwrap());

    // the page's own request unlocks
    let (status, answer) = http(
        &url,
        "POST",
        "/api/unlock",
        None,
        &[("Origin", &own_origin), ("X-Lockctl-Token", &token)],
        &body,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(!fx.locks.is_locked(&key).await.unwrap());
    let e = guard.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
}

/// `--allow-host NAME[:PORT]`: a name the console is reached by (a DNS name of the machine, a
/// reverse proxy's), with any port or with that port only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_allow_host_admits_the_names_given() {
    let fx = Fixture::new(Kind::Single).await;
    let key = unique_key("allowed");
    let _guard = fx
        .locks
        .lock(&key)
        .lease(Duration::from_secs(60))
        .await
        .unwrap();
    let (_serve, url) = serve(
        &fx.config,
        &[
            "--allow-unlock",
            "--allow-host",
            "locks.internal",
            "--allow-host",
            "Proxy.Example:8443",
            &format!("{key}*"),
        ],
    )
    .await;
    let port = url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    for (host, status) in [
        (format!("locks.internal:{port}"), 200),
        ("locks.internal".to_owned(), 200),
        ("LOCKS.internal:9".to_owned(), 200),
        ("proxy.example:8443".to_owned(), 200),
        ("proxy.example".to_owned(), 421),
        (format!("proxy.example:{port}"), 421),
        (format!("localhost:{port}"), 200),
        (format!("[::1]:{port}"), 200),
        (format!("localhost.evil.example:{port}"), 421),
        ("127.0.0.1".to_owned(), 421),
    ] {
        let (got, answer) = http(&url, "GET", "/api/state", Some(&host), &[], "").await;
        assert_eq!(got, status, "Host {host}: {answer}");
    }
    // the Origin is held to the same names
    let (_, page) = http(&url, "GET", "/", None, &[], "").await;
    let token = page_token(&page);
    let body = format!(r#"{{"kind":"mutex","key":"{key}"}}"#);
    let (status, answer) = http(
        &url,
        "POST",
        "/api/unlock",
        Some("proxy.example:8443"),
        &[
            ("Origin", "https://evil.example:8443"),
            ("X-Lockctl-Token", &token),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(fx.locks.is_locked(&key).await.unwrap());
    let (status, answer) = http(
        &url,
        "POST",
        "/api/unlock",
        Some("proxy.example:8443"),
        &[
            ("Origin", "https://proxy.example:8443"),
            ("X-Lockctl-Token", &token),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(!fx.locks.is_locked(&key).await.unwrap());
}
