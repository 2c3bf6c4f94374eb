//! The futures are `Send` when the arguments are, also when the body uses a value that is not
//! `Send` only between awaits.
use std::rc::Rc;
use std::sync::Arc;

use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

struct Handle {
    id: u64,
}

#[distributed_lock(key = "handle:<handle.id>")]
async fn send_args(handle: Arc<Handle>, name: String) -> Result<usize, AppError> {
    Ok(name.len() + handle.id as usize)
}

// A non-Send value that lives only while the key is built does not make the future non-Send.
#[distributed_lock(key = "rc:<id>")]
async fn non_send_temporary_in_body(id: u64) -> Result<u64, AppError> {
    let doubled = {
        let rc = Rc::new(id);
        *rc * 2
    };
    Ok(doubled)
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    let send_args = assert_send(send_args(Arc::new(Handle { id: 1 }), "n".into()));
    assert_eq!(send_args.await.unwrap(), 2);
    assert_eq!(assert_send(non_send_temporary_in_body(1)).await.unwrap(), 2);
}
