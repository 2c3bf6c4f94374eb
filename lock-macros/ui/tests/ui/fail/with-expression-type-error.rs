use lock_runtime::{LockError, distributed_lock};

struct User {
    email: String,
}

impl User {
    fn email(&self) -> &str {
        &self.email
    }
}

#[distributed_lock(key = "user:<email>", with(email = user.mail()))]
async fn save(user: User) -> Result<(), LockError> {
    let _ = user;
    Ok(())
}

fn main() {}
