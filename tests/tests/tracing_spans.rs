//! Acquire and release are traced with spans carrying key, owner, fence and time waited.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Fixture;
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
    let key = unique_key("traced");
    let guard = locks.lock(&key).await.unwrap();
    let (fence, owner) = (guard.fence().to_string(), guard.owner().to_string());
    guard.release().await.unwrap();

    let spans = spans.lock().unwrap();
    let find = |name: &str| {
        spans
            .values()
            .find(|(n, f)| n == name && f.get("key").is_some_and(|k| k == &key))
            .map(|(_, f)| f.clone())
            .unwrap_or_else(|| panic!("no {name} span for {key}: {spans:?}"))
    };
    let acquire = find("lock.acquire");
    assert_eq!(acquire["owner"], owner);
    assert_eq!(acquire["fence"], fence);
    assert!(acquire["waited_ms"].parse::<u64>().is_ok(), "{acquire:?}");
    let release = find("lock.release");
    assert_eq!(release["fence"], fence);
    assert_eq!(release["owner"], owner);
    assert!(release.contains_key("held_ms"));
}
