//! What an acquire or release is for: the kind, the lock's names and the kind's extra argument.

use std::sync::Arc;

use super::kind::Kind;
use super::names::KeyNames;

/// What an acquire is for: the kind, the lock's Redis names and the kind's extra argument to
/// its acquire script (e.g. a semaphore's permit counts; empty for most kinds), and the
/// bounded name metrics and events give the lock (see `crate::metrics`).
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) kind: &'static Kind,
    pub(crate) names: KeyNames,
    pub(crate) extra: Arc<str>,
    pub(crate) label: &'static str,
}

impl Target {
    pub(crate) fn new(kind: &'static Kind, names: KeyNames) -> Target {
        Target {
            kind,
            names,
            extra: "".into(),
            label: crate::metrics::OTHER,
        }
    }
}
