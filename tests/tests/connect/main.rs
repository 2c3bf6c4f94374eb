//! How a service connects: TLS, credentials and the narrowest ACL.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod acl;
mod auth;
mod tls;
