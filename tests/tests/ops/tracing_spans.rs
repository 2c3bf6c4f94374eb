//! Acquire and release are traced with spans carrying key, owner, fence and time waited.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::Fixture;
use lock_tests::harness::unique_key;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

type Spans = Arc<Mutex<HashMap<u64, (String, HashMap<String, String>)>>>;

/// Records every span's name and the fields it was created or recorded with.
struct Recorder(Spans);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap()
            .insert(id.into_u64(), (attrs.metadata().name().to_owned(), fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some((_, fields)) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn acquire_and_release_spans_carry_key_owner_fence_and_wait() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(Recorder(spans.clone()));
    let _default = tracing::subscriber::set_default(subscriber);

    let fx = Fixture::single().await;
    let locks = fx.service(Duration::from_secs(30)).await;
    let other = fx.service(Duration::from_secs(30)).await;
    let key = unique_key("traced");
    let hold = Duration::from_millis(300);

    // an acquire that waits for another service's hold of `hold`
    let called = Instant::now();
    let first = locks.lock(&key).await.unwrap();
    let acquired_first = called.elapsed();
    let waiting = async {
        let called = Instant::now();
        let guard = other.lock(&key).wait(Duration::from_secs(5)).await.unwrap();
        (guard, called.elapsed())
    };
    let holding = async {
        tokio::time::sleep(hold).await;
        let called = Instant::now();
        first.release().await.unwrap();
        called.elapsed()
    };
    let ((second, waited), released_after) = tokio::join!(waiting, holding);
    let held = Instant::now();
    let (fence, owner) = (second.fence(), second.owner().to_string());
    tokio::time::sleep(Duration::from_millis(50)).await;
    second.release().await.unwrap();
    let held = held.elapsed();

    let spans = spans.lock().unwrap();
    let find = |name: &str, owner: &str| {
        spans
            .values()
            .find(|(n, f)| {
                n == name
                    && f.get("key").is_some_and(|k| k == &key)
                    && f.get("owner").is_some_and(|o| o == owner)
            })
            .map(|(_, f)| f.clone())
            .unwrap_or_else(|| panic!("no {name} span of {owner} for {key}: {spans:?}"))
    };
    let ms = |fields: &HashMap<String, String>, name: &str| -> u128 {
        fields[name]
            .parse()
            .unwrap_or_else(|_| panic!("{name} is a number of ms: {fields:?}"))
    };

    let acquire = find("lock.acquire", &owner);
    assert_eq!(acquire["fence"], fence.to_string());
    let waited_ms = ms(&acquire, "waited_ms");
    // it waited for the other hold (at least until that release was sent), and not longer
    // than the call took
    assert!(
        waited_ms + 1 >= hold.as_millis() && waited_ms <= waited.as_millis(),
        "waited_ms {waited_ms}: the call took {waited:?}, the lock was held {hold:?} \
         ({released_after:?} to release)"
    );
    let release = find("lock.release", &owner);
    assert_eq!(release["fence"], fence.to_string());
    let held_ms = ms(&release, "held_ms");
    assert!(
        held_ms >= 50 && held_ms <= held.as_millis(),
        "held_ms {held_ms}, held {held:?}"
    );

    // the first, uncontended acquire waited no longer than its call took
    let first_owner = spans
        .values()
        .find(|(n, f)| n == "lock.acquire" && f.get("key") == Some(&key) && f["owner"] != owner)
        .map(|(_, f)| f.clone())
        .unwrap();
    assert!(ms(&first_owner, "waited_ms") <= acquired_first.as_millis());
    assert!(first_owner["fence"].parse::<u64>().unwrap() < fence);
    let first_release = find("lock.release", &first_owner["owner"]);
    assert!(
        ms(&first_release, "held_ms") >= hold.as_millis(),
        "{first_release:?}"
    );
}
