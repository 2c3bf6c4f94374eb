//! Free loopback ports for the servers.
//!
//! A candidate is accepted only after a probe `bind` on `127.0.0.1` succeeds, and no port is
//! handed out twice by one process. Without `HARNESS_PORT_BASE` the candidates come from the OS
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
    handed_out: HashSet<u16>,
    /// Next offset inside this process's window (only with `HARNESS_PORT_BASE`).
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

/// A free loopback port that this process has not handed out before.
///
/// # Panics
///
/// If no free port can be found (the window of `HARNESS_PORT_BASE` is exhausted, or the OS keeps
/// returning ports already used).
pub(crate) fn pick() -> u16 {
    let mut guard = ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
    let alloc = guard.get_or_insert_with(Allocator::default);
    if let Some(start) = window_start() {
        while alloc.next < WINDOW {
            let port = start + alloc.next;
            alloc.next += 1;
            if !alloc.handed_out.contains(&port) && bindable(port) {
                alloc.handed_out.insert(port);
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
        if alloc.handed_out.insert(port) {
            return port;
        }
    }
    panic!("the OS kept returning loopback ports this process already used");
}
