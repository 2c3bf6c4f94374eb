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

fn main() {
    let mut shop = Shop { id: 1, sold: 0 };
    let _ = shop.sell(1);
    let _ = shop.restock(1);
    let _ = shop.sell_mut();
    let _ = Arc::new(Shop { id: 2, sold: 0 }).shared();
    let _ = Shop::associated(&shop);
    let _ = shop.close();
}
