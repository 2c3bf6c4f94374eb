//! Methods of an `#[async_trait]` impl: the impl's attribute rewrites them first, the lock
//! goes inside the boxed future, which stays `Send`.
use async_trait::async_trait;
use lock_runtime::{LockError, distributed_lock};

#[async_trait]
trait Shop {
    async fn buy(&self, goods: u64, qty: u32) -> Result<u32, LockError>;
    async fn restock(&mut self, goods: u64) -> Result<(), LockError>;
}

struct Store {
    id: u64,
}

#[async_trait]
impl Shop for Store {
    #[distributed_lock(key = "shop:<self.id>:goods:<goods>", wait = "2s")]
    async fn buy(&self, goods: u64, qty: u32) -> Result<u32, LockError> {
        if qty == 0 {
            return Ok(0);
        }
        Ok(qty + self.id as u32 + goods as u32)
    }

    #[distributed_lock(key = "shop:<self.id>:goods:<goods>")]
    async fn restock(&mut self, goods: u64) -> Result<(), LockError> {
        self.id += goods;
        Ok(())
    }
}

fn assert_send<T: Send>(_: T) {}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    let mut store = Store { id: 1 };
    assert_send(store.buy(7, 1));
    assert_eq!(store.buy(7, 1).await.unwrap(), 9);
    assert_eq!(store.buy(7, 0).await.unwrap(), 0, "the early return");
    store.restock(2).await.unwrap();
    assert_eq!(store.id, 3);
}
