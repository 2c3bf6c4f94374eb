//! The published crates build with the Rust version they declare (`rust-version`, the MSRV):
//! clippy's `incompatible_msrv` (denied in CI) checks their own code against it, this checks
//! their dependencies, as locked in `Cargo.lock`.

use std::process::Command;

/// The crates published from this workspace.
const PUBLISHED: [&str; 4] = ["lock-runtime", "lock-macros", "lock-duration", "lockctl"];

/// `1.88` and `1.88.0` alike, as (major, minor, patch).
fn version(text: &str) -> [u64; 3] {
    let mut parts = text.split('.').map(|part| part.parse().unwrap());
    [(); 3].map(|()| parts.next().unwrap_or(0))
}

#[test]
fn no_dependency_of_a_published_crate_needs_a_newer_rust_than_its_msrv() {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let package = |id: &str| packages.iter().find(|p| p["id"] == id).unwrap();
    let nodes = metadata["resolve"]["nodes"].as_array().unwrap();
    let node = |id: &str| nodes.iter().find(|n| n["id"] == id).unwrap();

    let mut todo: Vec<String> = packages
        .iter()
        .filter(|p| p["source"].is_null() && PUBLISHED.contains(&p["name"].as_str().unwrap()))
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(todo.len(), PUBLISHED.len(), "a published crate is missing");
    let msrv = version(
        package(&todo[0])["rust_version"]
            .as_str()
            .expect("rust-version set"),
    );
    let mut seen = std::collections::HashSet::new();
    let mut too_new = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        let p = package(&id);
        if let Some(needs) = p["rust_version"].as_str()
            && version(needs) > msrv
        {
            too_new.push(format!("{} {} needs {needs}", p["name"], p["version"]));
        }
        // what users build: normal and build dependencies, not dev-dependencies
        for dep in node(&id)["deps"].as_array().unwrap() {
            let used = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            if used {
                todo.push(dep["pkg"].as_str().unwrap().to_owned());
            }
        }
    }
    assert!(
        seen.len() > 50,
        "walked only {} packages: the graph was not followed",
        seen.len()
    );
    assert!(
        too_new.is_empty(),
        "dependencies newer than the MSRV {msrv:?} (lower them in Cargo.lock, or raise \
         rust-version): {too_new:?}"
    );
}
