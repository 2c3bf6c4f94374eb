//! Methods with every receiver (`&self`, `&mut self`, `self`, `self: Arc<Self>`), associated
//! fns returning `Self`, and an `async fn` of a trait impl; `self.field` in the key.
use std::sync::Arc;

use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

struct Shop {
    id: u32,
    sold: u32,
}

impl Shop {
    #[distributed_lock(key = "shop:<self.id>:goods:<goods_id>", lease = "500ms")]
    async fn sell(&self, goods_id: u64) -> Result<u32, AppError> {
        let _ = goods_id;
        Ok(self.sold)
    }

    #[distributed_lock(key = "shop:<self.id>")]
    async fn sell_mut(&mut self) -> Result<(), AppError> {
        self.sold += 1;
        Ok(())
    }

    #[distributed_lock(key = "shop:<self.id>")]
    async fn close(self) -> Result<Self, AppError> {
        Ok(self)
    }

    #[distributed_lock(key = "shop:<self.id>")]
    async fn shared(self: Arc<Self>) -> Result<u32, AppError> {
        Ok(self.id)
    }

    #[distributed_lock(key = "shop:<shop.id>")]
    async fn associated(shop: &Shop) -> Result<Self, AppError> {
        Ok(Self {
            id: shop.id,
            sold: 0,
        })
    }
}

trait Inventory {
    async fn restock(&self, amount: u32) -> Result<u32, AppError>;
}

impl Inventory for Shop {
    #[distributed_lock(key = "shop:<self.id>:restock")]
    async fn restock(&self, amount: u32) -> Result<u32, AppError> {
        Ok(self.sold + amount)
    }
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    let mut shop = Shop { id: 1, sold: 0 };
    assert_eq!(shop.sell(1).await.unwrap(), 0);
    assert_eq!(shop.restock(1).await.unwrap(), 1);
    shop.sell_mut().await.unwrap();
    assert_eq!(shop.sold, 1);
    let shared = Arc::new(Shop { id: 2, sold: 0 }).shared();
    assert_eq!(shared.await.unwrap(), 2);
    let associated = Shop::associated(&shop).await.unwrap();
    assert_eq!((associated.id, associated.sold), (1, 0));
    let closed = shop.close().await.unwrap();
    assert_eq!((closed.id, closed.sold), (1, 1));
}
