//! Names the body or the user chose do not clash with the expansion: a body shadowing the
//! key's parameter, parameters named like the generated locals, local items named like the
//! prelude's.
use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

// The key is built from the parameter before the body shadows it.
#[distributed_lock(key = "item:<id>")]
async fn shadows_the_key_value(id: u64) -> Result<String, AppError> {
    let id = format!("shadowed {id}");
    Ok(id)
}

// Names that look like the generated ones are the user's own.
#[distributed_lock(key = "item:<__lock_key>:<__lock_spec>")]
async fn generated_looking_names(__lock_key: u8, __lock_spec: u8) -> Result<u8, AppError> {
    let __lock_ret = __lock_key + __lock_spec;
    Ok(__lock_ret)
}

// Local items named like the prelude do not change what the expansion refers to.
#[distributed_lock(key = "item:<id>")]
async fn shadowed_prelude(id: u64) -> Result<u64, AppError> {
    #[allow(dead_code)]
    struct Option;
    #[allow(dead_code)]
    struct String;
    Ok(id)
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    assert_eq!(shadows_the_key_value(1).await.unwrap(), "shadowed 1");
    assert_eq!(generated_looking_names(1, 2).await.unwrap(), 3);
    assert_eq!(shadowed_prelude(1).await.unwrap(), 1);
}
