//! `kind = "read" | "write" | "lock"` and `keys = [..]` (trailing comma, constant keys, fields
//! of a parameter, `self`), on free fns and methods; the futures are `Send`.
use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "catalog:<shop>", kind = "read", wait = "1s")]
async fn list_goods(shop: u64) -> Result<Vec<u64>, AppError> {
    let _ = shop;
    Ok(Vec::new())
}

#[distributed_lock(
    key = "catalog:<shop>",
    kind = "write",
    lease = "30s",
    on_lost = "continue"
)]
async fn reprice(shop: u64, factor: f64) -> Result<(), AppError> {
    let _ = (shop, factor);
    Ok(())
}

#[distributed_lock("catalog:<shop>", kind = "lock", wait = "0s")]
async fn rebuild_index(shop: u64) -> Result<(), LockError> {
    let _ = shop;
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "2s", lease = "10s")]
async fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, AppError> {
    let _ = (from, to);
    Ok(amount)
}

// `kind = "lock"` is the mutex, which is what `keys` locks; one key and a constant key are fine.
#[distributed_lock(kind = "lock", keys = ["ledger", "account:<id>",], wait = "forever")]
async fn close(id: u64) -> std::result::Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(keys = ["batch:<job.id>"])]
async fn settle(job: Job) -> Result<(), AppError> {
    let _ = job.id;
    Ok(())
}

struct Job {
    id: u32,
}

struct Shop {
    id: u32,
}

impl Shop {
    #[distributed_lock(key = "shop:<self.id>", kind = "read")]
    async fn stock(&self, goods_id: u64) -> Result<u64, AppError> {
        Ok(goods_id + u64::from(self.id))
    }

    #[distributed_lock(keys = ["shop:<self.id>", "goods:<goods_id>"], wait = "0s")]
    async fn move_goods(&mut self, goods_id: u64) -> Result<(), AppError> {
        let _ = goods_id;
        self.id += 1;
        Ok(())
    }
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    let futures = (
        list_goods(1),
        reprice(1, 1.1),
        rebuild_index(1),
        transfer(1, 2, 3),
        close(1),
        settle(Job { id: 1 }),
    );
    assert_send(&futures);
    let (list_goods, reprice, rebuild_index, transfer, close, settle) = futures;
    assert_eq!(list_goods.await.unwrap(), Vec::<u64>::new());
    reprice.await.unwrap();
    rebuild_index.await.unwrap();
    assert_eq!(transfer.await.unwrap(), 3);
    close.await.unwrap();
    settle.await.unwrap();

    let mut shop = Shop { id: 1 };
    assert_send(&shop.stock(1));
    assert_send(&shop.move_goods(1));
    assert_eq!(shop.stock(1).await.unwrap(), 2);
    shop.move_goods(1).await.unwrap();
    assert_eq!(shop.id, 2);
}
