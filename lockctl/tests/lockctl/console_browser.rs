//! The console's page in headless Chromium through chromedriver (WebDriver): holders, the
//! countdown, waiters, events, filter and sorting, force-unlock, the layout at two widths,
//! and the page going stale when Redis stops.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::{ErrorKind, owner};
use lock_tests::harness::{Spec, Topology, spawn_child};
use serde_json::Value;

use crate::{Fixture, Process, http, serve};

/// Polls `check` every 50 ms until it holds; panics naming `what` after `within`.
async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Chromium and chromedriver: `$CHROMIUM_BIN` / `$CHROMEDRIVER_BIN`, else found on `PATH`.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let find = |var: &str, names: &[&str]| -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(var) {
            return Some(PathBuf::from(path)).filter(|p| p.is_file());
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
            .find(|p| p.is_file())
    };
    Some((
        find(
            "CHROMIUM_BIN",
            &["chromium", "chromium-browser", "google-chrome"],
        )?,
        find("CHROMEDRIVER_BIN", &["chromedriver"])?,
    ))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver and the Chromium it started: when dropped (a test that failed did not close
/// its session), chromedriver is killed, and so is every process of the browser's profile,
/// which would outlive it.
struct Driver {
    _chromedriver: Process,
    profile: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let flag = format!("--user-data-dir={}", self.profile.display());
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        for pid in procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.split(|b| *b == 0).any(|arg| arg == flag.as_bytes()) {
                // SAFETY: a plain kill(2) of a process of this test's browser
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// chromedriver on a free loopback port, and a WebDriver session of headless Chromium.
async fn webdriver(
    chromium: &Path,
    chromedriver: &Path,
    profile: &Path,
) -> (Driver, fantoccini::Client) {
    let port = free_port();
    let mut cmd = Command::new(chromedriver);
    cmd.arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let driver = Driver {
        _chromedriver: Process(spawn_child(cmd).expect("start chromedriver")),
        profile: profile.to_owned(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver did not listen on {port} within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let options = serde_json::json!({
        "binary": chromium,
        "args": [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,760",
            format!("--user-data-dir={}", profile.display()),
        ],
    });
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = tokio::time::timeout(
        Duration::from_secs(60),
        fantoccini::ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}")),
    )
    .await
    .expect("a browser session within 60 s")
    .expect("a browser session");
    (driver, client)
}

/// The text of the first element matching `css`, read in one script run (the page redraws
/// its table when the locks change).
async fn text_of(client: &fantoccini::Client, css: &str) -> String {
    let script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;";
    let text = client
        .execute(script, vec![Value::from(css)])
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    match text {
        Value::String(text) => text,
        other => panic!("no {css} on the page ({other})"),
    }
}

/// Clicks the element matching `css` (again when the page redrew it meanwhile).
async fn click(client: &fantoccini::Client, css: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let clicked = match client.find(fantoccini::Locator::Css(css)).await {
            Ok(element) => element.click().await,
            Err(e) => Err(e),
        };
        match clicked {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "cannot click {css}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Seconds in a lease cell (`41.3s`).
fn seconds(text: &str) -> f64 {
    text.trim()
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a lease in seconds: {text:?}"))
}

/// Makes the page's viewport `width` x `height` CSS pixels (the window of headless Chromium
/// may add a frame: it is measured and made up for).
async fn set_viewport(client: &fantoccini::Client, width: u32, height: u32) {
    let inner = "return [window.innerWidth, window.innerHeight];";
    let (mut w, mut h) = (width, height);
    for _ in 0..3 {
        client.set_window_size(w, h).await.unwrap();
        let got = client.execute(inner, vec![]).await.unwrap();
        let (got_w, got_h) = (got[0].as_u64().unwrap(), got[1].as_u64().unwrap());
        if (got_w, got_h) == (u64::from(width), u64::from(height)) {
            return;
        }
        // the frame: what the window has beyond the viewport
        w = (u64::from(w) + u64::from(width)).saturating_sub(got_w) as u32;
        h = (u64::from(h) + u64::from(height)).saturating_sub(got_h) as u32;
    }
    panic!("cannot make the viewport {width}x{height}");
}

/// What sticks out of the viewport sideways: the page's scroll width beyond its width, and
/// the elements (with their text) whose box leaves it.
async fn off_screen(client: &fantoccini::Client) -> Vec<String> {
    let script = r#"
        const width = document.documentElement.clientWidth;
        const out = [];
        if (document.documentElement.scrollWidth > width) {
            out.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + width);
        }
        for (const e of document.querySelectorAll("body *")) {
            const r = e.getBoundingClientRect();
            if (r.width > 0 && (r.right > width + 0.5 || r.left < -0.5)) {
                out.push(e.tagName + "." + e.className + " [" + Math.round(r.left) + ", " +
                    Math.round(r.right) + "] of " + width + ": " + (e.innerText || "").slice(0, 60));
            }
        }
        return out;"#;
    let found = client.execute(script, vec![]).await.unwrap();
    serde_json::from_value(found).unwrap()
}

/// Saves a screenshot of the page as `target/lockctl-<name>.png`; one `for_docs` also as
/// `<name>.png` in `$LOCKCTL_SCREENSHOTS_DIR` when that is set (the README's pictures: `docs/`).
async fn screenshot(client: &fantoccini::Client, name: &str, for_docs: bool) -> PathBuf {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
    let path = target.join(format!("lockctl-{name}.png"));
    std::fs::write(&path, &png).unwrap();
    if let Some(dir) = std::env::var_os("LOCKCTL_SCREENSHOTS_DIR").filter(|_| for_docs) {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
    }
    path
}

/// The texts of the elements matching `css` (none: empty), read in one script run.
async fn texts_of(client: &fantoccini::Client, css: &str) -> Vec<String> {
    let script = "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText);";
    let texts = client
        .execute(script, vec![Value::from(css)])
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    serde_json::from_value(texts).unwrap()
}

/// Waits until the text of an element matching `css` contains `wanted`.
async fn wait_for_text(client: &fantoccini::Client, css: &str, wanted: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let text = texts_of(client, css).await.join("\n");
        if text.contains(wanted) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {wanted:?} in {css} within {within:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The keys of the rows shown, top to bottom.
async fn shown_keys(client: &fantoccini::Client) -> Vec<String> {
    let script =
        "return [...document.querySelectorAll('#lock-rows tr.lock')].map(r => r.dataset.key);";
    serde_json::from_value(client.execute(script, vec![]).await.unwrap()).unwrap()
}

/// Types `text` into the key filter (replacing what was there).
async fn filter_keys(client: &fantoccini::Client, text: &str) {
    // WebDriver's clear fires no input event: empty it as a user's select-and-delete would
    let empty = "const f = document.getElementById('filter'); f.value = ''; \
                 f.dispatchEvent(new Event('input'));";
    client.execute(empty, vec![]).await.unwrap();
    let filter = client
        .find(fantoccini::Locator::Css("#filter"))
        .await
        .unwrap();
    if !text.is_empty() {
        filter.send_keys(text).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium() {
    let Some((chromium, chromedriver)) = browser() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the console test: chromium and chromedriver are missing \
             (scripts/test.sh installs the Debian packages chromium and chromium-driver)"
        );
        eprintln!(
            "SKIPPED console_in_chromium: chromium / chromedriver not installed (apt-get \
             install chromium chromium-driver; scripts/test.sh installs them)"
        );
        return;
    };
    let started = Instant::now();
    // a server of its own: the test stops it to see the page go stale
    let topo = Topology::start(Spec::Single).await;
    let fx = Fixture::private(&topo, "orders-1").await;
    let locks = &fx.locks;
    // the server is the test's own: the keys need no prefix of their own, and the screenshots
    // show keys as a service names them
    let key = "goods:42".to_owned();
    let lease = Duration::from_secs(45);
    let guard = owner::chain("req-42", async { locks.lock(&key).lease(lease).await })
        .await
        .unwrap();
    // another service, whose caller will wait for the nightly job (a service's own callers
    // wait behind its holds without registering on Redis); connected before the job is
    // taken, so that goods:42 is clearly the oldest hold
    let billing = fx.other_service("billing-2").await;
    // something of every kind on the page
    let job_key = "job:nightly".to_owned();
    let job = owner::chain("nightly-report", async { locks.lock(&job_key).await })
        .await
        .unwrap();
    let waiter = {
        let (locks, job_key) = (billing.clone(), job_key.clone());
        tokio::spawn(owner::chain("req-77", async move {
            locks.lock(&job_key).wait(Duration::from_secs(120)).await
        }))
    };
    let catalog = "catalog:7".to_owned();
    let r1 = owner::chain("req-50", async {
        locks.read(&catalog).lease(Duration::from_secs(30)).await
    })
    .await
    .unwrap();
    let r2 = owner::chain("req-51", async {
        locks.read(&catalog).lease(Duration::from_secs(20)).await
    })
    .await
    .unwrap();
    let second_goods = owner::chain("req-43", async {
        locks.lock("goods:43").lease(Duration::from_secs(90)).await
    })
    .await
    .unwrap();
    // a job done, its lock kept for its minimum hold
    let report = "report:daily".to_owned();
    let done = owner::chain("daily-report", async {
        locks
            .lock(&report)
            .hold_at_least(Duration::from_secs(120))
            .await
    })
    .await
    .unwrap();
    done.release().await.unwrap();
    let renders = locks.semaphore("pdf-render", 4);
    let permit = owner::chain("req-60", async {
        renders.acquire_many(2).lease(Duration::from_secs(40)).await
    })
    .await
    .unwrap();

    let (_serve, url) = serve(&fx.config, &["--allow-unlock"]).await;
    let profile = tempfile::tempdir().unwrap();
    let (_driver, client) = webdriver(&chromium, &chromedriver, profile.path()).await;
    let ready = started.elapsed();
    set_viewport(&client, 1280, 800).await;
    client.goto(&url).await.unwrap();
    let row = format!("tr.lock[data-key=\"{key}\"][data-kind=\"mutex\"]");
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(fantoccini::Locator::Css(&row))
        .await
        .expect("the held lock is shown");

    // the holder and the request it was taken for
    let owner_text = text_of(&client, &format!("{row} .owner")).await;
    assert_eq!(owner_text, guard.owner().as_str());
    assert!(owner_text.starts_with("req-42#"), "{owner_text}");
    let request = text_of(&client, &format!("{row} .request")).await;
    assert!(request.contains("req-42"), "{request}");
    assert!(!request.contains("req-42#"), "{request}");

    // the lease counts down
    let lease_text = |t: String| seconds(t.trim().trim_start_matches("lease").trim());
    let first = lease_text(text_of(&client, &format!("{row} .lease")).await);
    assert!(first > 0.0 && first <= lease.as_secs_f64(), "{first}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let second = loop {
        let now = lease_text(text_of(&client, &format!("{row} .lease")).await);
        if now < first - 0.5 {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the lease stayed at {now}s (first {first}s)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(second > first - 5.0, "{first} -> {second}");

    // which instance holds it, for how long
    assert_eq!(
        text_of(&client, &format!("{row} .instance")).await,
        "orders-1"
    );
    let age = text_of(&client, &format!("{row} .age")).await;
    let secs: u64 = age
        .strip_prefix("held ")
        .and_then(|a| a.strip_suffix('s'))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not an age: {age:?}"));
    assert!(secs < 60, "{age}");

    // who waits: the waiting callers of each service (services report them every second)
    let job_row = format!("tr.lock[data-key=\"{job_key}\"]");
    wait_for_text(
        &client,
        &format!("{job_row} .waiting"),
        "billing-2",
        Duration::from_secs(10),
    )
    .await;
    let waiting = text_of(&client, &format!("{job_row} .waiter-count")).await;
    assert_eq!(waiting, "1");

    // done, kept: nobody holds it
    let kept_row = format!("tr.lock.kept[data-key=\"{report}\"]");
    let kept = text_of(&client, &format!("{kept_row} .holders")).await;
    assert!(kept.contains("done, kept until "), "{kept}");
    assert!(
        texts_of(&client, &format!("{kept_row} .lease"))
            .await
            .is_empty(),
        "{kept}"
    );

    // a hold whose lease runs out while the console watches
    let cart = "cart:9".to_owned();
    let expiring = owner::chain("req-61", async {
        locks.lock(&cart).lease(Duration::from_secs(3)).await
    })
    .await
    .unwrap();
    client
        .wait()
        .at_most(Duration::from_millis(2500))
        .for_element(fantoccini::Locator::Css(&format!(
            "tr.lock[data-key=\"{cart}\"]"
        )))
        .await
        .expect("the console lists the hold before its lease runs out");

    // changes between refreshes become events, each kind named as what it was
    r2.release().await.unwrap();
    wait_for_text(&client, "#events", "released", Duration::from_secs(5)).await;
    let events = text_of(&client, "#events").await;
    assert!(events.contains(&format!("rw {catalog}")), "{events}");
    assert!(events.contains("request req-51"), "{events}");
    // the lease of the cart ran out: expired, not released
    let deadline = Instant::now() + Duration::from_secs(10);
    while !texts_of(&client, "#events li.event-expired")
        .await
        .join("\n")
        .contains(&cart)
    {
        assert!(
            Instant::now() < deadline,
            "no expired event of {cart}: {:?}",
            texts_of(&client, "#events li").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expired = texts_of(&client, "#events li.event-expired")
        .await
        .join("\n");
    assert!(expired.contains("expired"), "{expired}");
    assert!(expired.contains("request req-61"), "{expired}");
    let released = texts_of(&client, "#events li.event-released").await;
    assert!(!released.iter().any(|e| e.contains(&cart)), "{released:?}");
    drop(expiring);

    // filter by key: text, then a glob
    filter_keys(&client, "catalog").await;
    assert_eq!(shown_keys(&client).await, [catalog.as_str()]);
    filter_keys(&client, "*:nightly").await;
    assert_eq!(shown_keys(&client).await, [job_key.as_str()]);
    wait_for_text(&client, "#count", "1 of 6", Duration::from_secs(2)).await;
    filter_keys(&client, "").await;
    let keys = shown_keys(&client).await;
    assert_eq!(keys.len(), 6, "{keys:?}");
    // sorted by key, by waiters
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    client
        .find(fantoccini::Locator::Css("#sort"))
        .await
        .unwrap()
        .select_by_value("waiters")
        .await
        .unwrap();
    assert_eq!(shown_keys(&client).await[0], job_key);
    client
        .find(fantoccini::Locator::Css("#sort"))
        .await
        .unwrap()
        .select_by_value("age")
        .await
        .unwrap();
    assert_eq!(
        shown_keys(&client).await[0],
        key,
        "the oldest hold first: {:?}",
        texts_of(&client, "#lock-rows tr.lock").await
    );
    client
        .find(fantoccini::Locator::Css("#sort"))
        .await
        .unwrap()
        .select_by_value("key")
        .await
        .unwrap();

    // at 1280 px everything is on screen, the force-unlock buttons too
    let problems = off_screen(&client).await;
    assert!(problems.is_empty(), "at 1280 px: {problems:#?}");

    // force-unlock behind a confirmation
    click(&client, &format!("{row} button.unlock")).await;
    let confirm = client
        .find(fantoccini::Locator::Css("#confirm-yes"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !confirm.is_displayed().await.unwrap() {
        assert!(Instant::now() < deadline, "no confirmation dialog");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dialog = text_of(&client, "#confirm-text").await;
    assert!(
        dialog.contains(&key) && dialog.contains("req-42"),
        "{dialog}"
    );
    assert!(
        locks.is_locked(&key).await.unwrap(),
        "nothing happens before confirming"
    );
    confirm.click().await.unwrap();
    eventually(
        "the lock is gone on Redis",
        Duration::from_secs(5),
        || async { !locks.inspect(&key).await.unwrap().is_held() },
    )
    .await;
    eventually("the page shows it gone", Duration::from_secs(5), || async {
        client
            .find_all(fantoccini::Locator::Css(&row))
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    wait_for_text(
        &client,
        "#events li.event-force-unlocked",
        &key,
        Duration::from_secs(5),
    )
    .await;
    let unlocked = texts_of(&client, "#events li.event-force-unlocked")
        .await
        .join("\n");
    assert!(unlocked.contains("force-unlocked"), "{unlocked}");
    let e = guard.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    let other = text_of(&client, "#lock-rows").await;
    assert!(
        other.contains("nightly-report#"),
        "the other locks stay: {other}"
    );
    assert!(!text_of(&client, "#status").await.contains("stale"));
    // the header: the server, its role and health, as probed
    let port = topo.ports()[0];
    let node = text_of(&client, "#nodes .node.up").await;
    assert!(
        node.contains(&format!("127.0.0.1:{port}")) && node.contains("master"),
        "{node}"
    );
    let wide = screenshot(&client, "console-1280", true).await;

    // at 800 px: cards, nothing off screen
    set_viewport(&client, 800, 1000).await;
    let problems = off_screen(&client).await;
    assert!(problems.is_empty(), "at 800 px: {problems:#?}");
    let head_shown = client
        .execute(
            "return getComputedStyle(document.querySelector('#locks thead')).display;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(head_shown, "none", "the narrow layout has no table header");
    let narrow = screenshot(&client, "console-800", true).await;

    // without --allow-unlock there is no button
    let (_plain, plain_url) = serve(&fx.config, &[]).await;
    client.goto(&plain_url).await.unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(fantoccini::Locator::Css(&job_row))
        .await
        .unwrap();
    let buttons = client
        .find_all(fantoccini::Locator::Css("button.unlock"))
        .await
        .unwrap();
    assert!(
        buttons.is_empty(),
        "force-unlock is offered without --allow-unlock"
    );

    // Redis stops: the page says the data is stale, and so does the API
    client.goto(&url).await.unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(fantoccini::Locator::Css(&job_row))
        .await
        .unwrap();
    set_viewport(&client, 1280, 800).await;
    waiter.abort();
    topo.kill(port);
    wait_for_text(
        &client,
        "#stale",
        "Redis unreachable",
        Duration::from_secs(10),
    )
    .await;
    let status = client
        .execute(
            "const s = document.querySelector('#status'); \
             return [s.className, s.innerText, document.body.className];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(status[0], "status stale", "{status}");
    assert!(
        status[1].as_str().unwrap().starts_with("stale since"),
        "{status}"
    );
    assert!(status[2].as_str().unwrap().contains("is-stale"), "{status}");
    wait_for_text(
        &client,
        "#nodes .node.down",
        &format!("127.0.0.1:{port}"),
        Duration::from_secs(10),
    )
    .await;
    let banner = text_of(&client, "#stale").await;
    assert!(banner.contains("showing the locks as of"), "{banner}");
    assert!(
        text_of(&client, "#lock-rows")
            .await
            .contains("nightly-report#"),
        "the last list stays, dimmed"
    );
    let (code, body) = http(&url, "GET", "/api/state", None, &[], "").await;
    assert_eq!(code, 200, "{body}");
    let state: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["stale"], true, "{state}");
    assert!(state["last_error"]["message"].is_string(), "{state}");
    assert!(
        state["last_ok_ms"].as_u64().unwrap() <= state["stale_since_ms"].as_u64().unwrap(),
        "{state}"
    );
    let stale = screenshot(&client, "console-stale", false).await;
    client.close().await.unwrap();

    // the holds went with the server
    drop((job, second_goods, r1, permit));
    eprintln!(
        "console_in_chromium: browser ready after {:.1}s, whole test {:.1}s; screenshots {}, \
         {}, {}",
        ready.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        wide.display(),
        narrow.display(),
        stale.display()
    );
}
