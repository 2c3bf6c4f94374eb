//! Free loopback ports for the servers.
//!
//! A candidate is accepted only after a probe `bind` on `127.0.0.1` succeeds, and a port is not
//! handed out again while a node of this process owns it (a killed node keeps its port for
//! `restart`; [`release`] gives it back when the node is dropped). Without `HARNESS_PORT_BASE` the candidates come from the OS
//! (`bind(127.0.0.1:0)`). With it, each process walks its own window of [`WINDOW`] ports starting
//! at `base + (pid % WINDOWS) * WINDOW`, so test processes running side by side rarely probe the
//! same ports. A port can still be taken between the probe and the server's own `bind`; the node
//! launcher notices that ("Address already in use" in the log) and asks for another port.

use std::collections::HashSet;
use std::env;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, PoisonError};

/// Ports per process window when `HARNESS_PORT_BASE` is set.
pub(crate) const WINDOW: u16 = 100;

/// Number of distinct windows above `HARNESS_PORT_BASE`.
pub(crate) const WINDOWS: u16 = 50;

#[derive(Debug, Default)]
struct Allocator {
    /// Ports owned by live nodes of this process.
    owned: HashSet<u16>,
    /// Next offset to try inside this process's window (only with `HARNESS_PORT_BASE`).
    next: u16,
}

static ALLOCATOR: Mutex<Option<Allocator>> = Mutex::new(None);

/// The first port of this process's window, if `HARNESS_PORT_BASE` is set.
///
/// # Panics
///
/// If `HARNESS_PORT_BASE` is not a port number, or the windows would run past port 65535.
pub(crate) fn window_start() -> Option<u16> {
    let raw = env::var("HARNESS_PORT_BASE").ok()?;
    let base: u16 = raw
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("HARNESS_PORT_BASE={raw:?} is not a port number"));
    let span = u32::from(WINDOW) * u32::from(WINDOWS);
    assert!(
        u32::from(base) + span <= 65_535 && base >= 1024,
        "HARNESS_PORT_BASE={base} must be in 1024..={} (the harness uses {span} ports above it)",
        65_535 - span
    );
    let slot = (std::process::id() % u32::from(WINDOWS)) as u16;
    Some(base + slot * WINDOW)
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A free loopback port that no live node of this process owns.
///
/// # Panics
///
/// If no free port can be found (every port of the `HARNESS_PORT_BASE` window is owned or
/// taken, or the OS keeps returning owned ports).
pub(crate) fn pick() -> u16 {
    let mut guard = ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
    let alloc = guard.get_or_insert_with(Allocator::default);
    if let Some(start) = window_start() {
        for _ in 0..WINDOW {
            let port = start + alloc.next;
            alloc.next = (alloc.next + 1) % WINDOW;
            if !alloc.owned.contains(&port) && bindable(port) {
                alloc.owned.insert(port);
                return port;
            }
        }
        panic!(
            "no free port left in {start}..{} (HARNESS_PORT_BASE window of this process)",
            start + WINDOW
        );
    }
    for _ in 0..1000 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("no local address for 127.0.0.1:0: {e}"))
            .port();
        drop(listener);
        if alloc.owned.insert(port) {
            return port;
        }
    }
    panic!("the OS kept returning loopback ports this process already uses");
}

/// Gives `port` back once no node uses it any more.
pub(crate) fn release(port: u16) {
    let mut guard = ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(alloc) = guard.as_mut() {
        alloc.owned.remove(&port);
    }
}
