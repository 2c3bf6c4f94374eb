//! The Redis servers as the page's header shows them: the servers a probe found, or those the
//! configuration names (their addresses without user, password or query) with their roles.

use lock_runtime::{RedisNodes, Topology};
use serde_json::{Value, json};

/// The host and port (or socket path) of a Redis URL, without its user, password or query;
/// `None` when that cannot be told safely (an `@` after the host: a password with a `/`, `?`
/// or `#` in it, or in a query).
fn address_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if tail.contains('@') {
        return None;
    }
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if !host.is_empty() {
        return Some(host);
    }
    // a Unix socket (`redis+unix:///run/redis.sock`): its path
    let path = tail.split(['?', '#']).next().unwrap_or_default();
    (!path.is_empty()).then_some(path)
}

/// The servers the configuration names, with their roles there.
fn configured_nodes(topology: &Topology) -> Vec<(&str, &'static str)> {
    fn shown(url: &str) -> &str {
        address_of(url).unwrap_or("(address not shown)")
    }
    match topology {
        Topology::Single { url } => vec![(shown(url), "master")],
        Topology::Cluster { nodes } => nodes.iter().map(|n| (shown(n), "seed")).collect(),
        Topology::Sentinel { sentinels, .. } => {
            sentinels.iter().map(|n| (shown(n), "sentinel")).collect()
        }
        Topology::MasterSlave { master, replicas } => std::iter::once((shown(master), "master"))
            .chain(replicas.iter().map(|r| (shown(r), "replica")))
            .collect(),
        _ => Vec::new(),
    }
}

/// The servers `nodes()` found, as the page's header shows them.
pub(super) fn nodes_json(nodes: &RedisNodes) -> Value {
    let list: Vec<Value> = nodes
        .nodes
        .iter()
        .map(|n| {
            json!({
                "address": n.address,
                "role": n.role.as_str(),
                "healthy": n.healthy,
                "latency_ms": n.latency.map(|l| l.as_secs_f64() * 1000.0),
                "replica_of": n.replica_of,
                "detail": n.detail,
            })
        })
        .collect();
    json!({ "mode": nodes.mode, "nodes": list })
}

/// The topology as the page's header shows it: the servers as last probed (`"health":
/// "probe"`, with `probed_ms`); before the first probe, or when no server answered it, the
/// nodes of the configuration, healthy while the console's refreshes succeed (`"health":
/// "refresh"`).
pub(super) fn redis_json(
    topology: &Topology,
    probe: Option<&(u64, Result<Value, String>)>,
    healthy: bool,
) -> Value {
    let master_name = match topology {
        Topology::Sentinel { master_name, .. } => Some(master_name.as_str()),
        _ => None,
    };
    if let Some((at, Ok(found))) = probe {
        let mut found = found.clone();
        found["master_name"] = json!(master_name);
        found["health"] = json!("probe");
        found["probed_ms"] = json!(at);
        return found;
    }
    let failed = probe.and_then(|(_, r)| r.as_ref().err());
    let nodes: Vec<Value> = configured_nodes(topology)
        .into_iter()
        .map(|(address, role)| {
            json!({
                "address": address,
                "role": role,
                "healthy": healthy && failed.is_none(),
                "latency_ms": null,
                "detail": failed,
            })
        })
        .collect();
    json!({
        "mode": topology.mode(),
        "master_name": master_name,
        "nodes": nodes,
        "health": "refresh",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_without_credentials() {
        assert_eq!(address_of("redis://127.0.0.1:6379"), Some("127.0.0.1:6379"));
        assert_eq!(
            address_of("rediss://ops:s3cret@redis.internal:6380/2?db=1"),
            Some("redis.internal:6380")
        );
        assert_eq!(address_of("redis://:p@w@host:1"), Some("host:1"));
        assert_eq!(
            address_of("redis+unix:///run/redis.sock?db=1"),
            Some("/run/redis.sock")
        );
        // where the password ends is unclear: nothing shown
        assert_eq!(address_of("redis://u:p?w@host:1"), None);
        assert_eq!(address_of("redis://u:1234/x@host:1"), None);
        assert_eq!(address_of("redis://host:1?password=p@ss"), None);
        let topology = Topology::MasterSlave {
            master: "redis://u:pw@10.0.0.1:6379".into(),
            replicas: vec!["redis://10.0.0.2:6379?password=pw".into()],
        };
        let shown = redis_json(&topology, None, true).to_string();
        assert!(!shown.contains("pw"), "{shown}");
        assert!(shown.contains("10.0.0.1:6379"), "{shown}");
        assert!(shown.contains("10.0.0.2:6379"), "{shown}");
    }
}
