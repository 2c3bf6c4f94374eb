//! Fencing tokens, on a single node: write grants get strictly increasing tokens, a reader's
//! own token lies between the writes before and after it, and a read inside a write body
//! shares the write's token.

use std::time::Duration;

use crate::common::Fixture;
use crate::support::{LONG, WAIT, ends_up_free};
use lock_tests::harness::unique_key;

/// Write grants get strictly increasing fencing tokens: across services, after a release, after
/// a lease ran out without a release, with readers in between (each reader's own token lies
/// between the writes before and after it, never equal to one); a read inside a write body gets
/// the write's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_tokens_strictly_increase() {
    let fx = Fixture::single().await;
    let services = [
        fx.service(LONG).await,
        fx.service(LONG).await,
        fx.service(LONG).await,
    ];
    let key = unique_key("fence");
    let mut tokens = Vec::new();
    for round in 0..9 {
        let s = &services[round % 3];
        if round % 3 == 1 {
            // a write that is never released: its lease runs out
            let w = s
                .write(&key)
                .lease(Duration::from_millis(100))
                .await
                .unwrap();
            tokens.push(w.fence());
            tokio::time::timeout(Duration::from_secs(3), w.lost())
                .await
                .expect("the lease runs out");
            drop(w);
        } else {
            let r = s.read(&key).wait(WAIT).await.unwrap();
            let read = r.fence();
            assert!(
                tokens.last().is_none_or(|t| read > *t),
                "a reader's token is its own, newer than every write before it"
            );
            r.release().await.unwrap();
            let (t, inner) = s
                .write(&key)
                .wait(WAIT)
                .run_nested(|held| {
                    let key = &key;
                    async move {
                        let inner = s.read(key).try_once().await.unwrap();
                        let t = inner.fence();
                        inner.release().await.unwrap();
                        (held.fence(), t)
                    }
                })
                .await
                .unwrap();
            assert_eq!(inner, t, "a downgrade shares the write's token");
            assert!(
                t > read,
                "a write after a read has a newer token than the reader's"
            );
            tokens.push(t);
        }
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    ends_up_free(&fx, &services[0], &key, Duration::from_secs(5)).await;
}
