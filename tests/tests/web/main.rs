//! The web middleware over real HTTP: axum (tower), actix-web, and the shop as separate OS
//! processes.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
#[path = "../web_common/mod.rs"]
mod web_common;

mod on_actix;
mod on_axum;
mod processes;
