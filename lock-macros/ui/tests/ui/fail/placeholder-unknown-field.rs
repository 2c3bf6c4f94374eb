use lock_runtime::{LockError, distributed_lock};

struct Req {
    goods_id: u64,
}

#[distributed_lock(key = "goods:<req.goodsid>")]
async fn buy(req: Req) -> Result<u64, LockError> {
    Ok(req.goods_id)
}

fn main() {}
