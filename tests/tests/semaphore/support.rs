//! What several modules use: the semaphore's keys, grants and waiting set read on Redis, and
//! the server's clock (a service reached through a fault proxy is `common::behind_proxy`).

use std::collections::HashMap;
use std::time::Duration;

use crate::common::Fixture;

pub(crate) const LONG: Duration = Duration::from_secs(30);

/// The hash of the semaphore `name` on Redis (default prefix `lock:`).
pub(crate) fn sem_hash(name: &str) -> String {
    format!("lock:sem:{{{name}}}")
}

/// The grants of the semaphore `name` on Redis: grant field -> '<expiry ms> <permits> <owner>'.
pub(crate) fn grants_on_redis(fx: &Fixture, name: &str) -> HashMap<String, String> {
    let hash = sem_hash(name);
    let all: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&hash)
        .query(&mut fx.conn_for(&hash))
        .unwrap();
    all.into_iter()
        .filter(|(f, _)| f.starts_with("p:"))
        .collect()
}

/// The services registered as waiting for the semaphore `name` (its `:wq` zset): member ->
/// registered until (server ms).
pub(crate) fn waiting_set(fx: &Fixture, name: &str) -> Vec<(String, u64)> {
    let queue = format!("{}:wq", sem_hash(name));
    redis::cmd("ZRANGE")
        .arg(&queue)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut fx.conn_for(&queue))
        .unwrap()
}

/// The server's clock in ms (the waiting set's scores are in it).
pub(crate) fn server_ms(fx: &Fixture) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut fx.redis()).unwrap();
    s * 1000 + us / 1000
}

/// The permits the grants on Redis hold, live or not.
pub(crate) fn permits_on_redis(fx: &Fixture, name: &str) -> u64 {
    grants_on_redis(fx, name)
        .values()
        .map(|v| v.split(' ').nth(1).unwrap().parse::<u64>().unwrap())
        .sum()
}
