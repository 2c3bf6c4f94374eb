use lock_runtime::{LockError, distributed_lock};

struct User {
    email: String,
}

impl User {
    fn email(&self) -> &str {
        &self.email
    }
}

struct Opaque;

#[distributed_lock(key = "user:<who>", with(who = Opaque))]
async fn save(user: User) -> Result<(), LockError> {
    let _ = user;
    Ok(())
}

fn main() {}
