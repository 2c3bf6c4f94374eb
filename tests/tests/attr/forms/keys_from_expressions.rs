//! Keys built from more than fields: argument-less method calls in placeholders
//! (`<user.email()>`), and any Rust expression over the arguments computed in `with(..)` and
//! named by a placeholder (`key = "user:<email>", with(email = user.email().to_lowercase())`).
//! Each body reads the key it runs under.
use lock_runtime::{LockError, current_lock_key, distributed_lock};

struct User {
    email: String,
    tenant: Tenant,
}

struct Tenant {
    id: u32,
}

impl User {
    fn email(&self) -> &str {
        &self.email
    }

    fn tenant(&self) -> &Tenant {
        &self.tenant
    }
}

impl Tenant {
    fn slug(&self) -> String {
        format!("t{}", self.id)
    }
}

#[distributed_lock(key = "user:<user.email()>:<user.tenant().slug()>")]
async fn by_method(user: User) -> Result<String, LockError> {
    // the body still owns `user`
    drop(user);
    Ok(current_lock_key().unwrap())
}

#[distributed_lock(
    key = "user:<email>:<email>",
    with(email = user.email().to_lowercase()),
    wait = "1s"
)]
async fn by_expression(user: &User) -> Result<String, LockError> {
    let _ = user.email();
    Ok(current_lock_key().unwrap())
}

#[distributed_lock(
    keys = ["account:<low>", "account:<high>"],
    with(low = from.min(to), high = from.max(to))
)]
async fn transfer(from: u64, to: u64) -> Result<String, LockError> {
    let _ = (from, to);
    Ok(current_lock_key().unwrap())
}

struct Cart {
    items: Vec<u32>,
}

impl Cart {
    #[distributed_lock(key = "cart:<n>:<first>", with(n = self.items.len(), first = self.items[0]))]
    async fn checkout(&mut self) -> Result<String, LockError> {
        self.items.clear();
        Ok(current_lock_key().unwrap())
    }
}

#[tokio::test]
async fn runs_under_the_lock() {
    super::setup().await;
    let user = || User {
        email: "Alice@Example.com".to_owned(),
        tenant: Tenant { id: 7 },
    };
    assert_eq!(
        by_method(user()).await.unwrap(),
        "user:Alice@Example.com:t7"
    );
    assert_eq!(
        by_expression(&user()).await.unwrap(),
        "user:alice@example.com:alice@example.com"
    );
    // the first lock taken, in Redis key order: the same for both directions
    assert_eq!(transfer(9, 3).await.unwrap(), transfer(3, 9).await.unwrap());
    let mut cart = Cart { items: vec![5, 6] };
    assert_eq!(cart.checkout().await.unwrap(), "cart:2:5");
    assert!(cart.items.is_empty());
}
