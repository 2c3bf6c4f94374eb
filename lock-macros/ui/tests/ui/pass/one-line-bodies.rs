//! One-line bodies draw no lint the user did not cause.
#![deny(warnings)]

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "goods:<id>")]
async fn one_line(id: u64) -> Result<u64, LockError> { Ok(id) }

fn main() {
    let _ = one_line(1);
}
