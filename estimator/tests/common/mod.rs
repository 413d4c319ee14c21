//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared` next to the repository (override with `CARMA_SHARED_DIR`).
/// Panics with a clear message when it is missing: these tests never skip.
pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("CARMA_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    assert!(
        dir.join("data").is_dir(),
        "shared data not found at {} (expected the read-only ../shared next to the repository, \
         holding data/gpumemnet/*.csv and data/model-summaries/; set CARMA_SHARED_DIR to override)",
        dir.display()
    );
    dir
}

/// A file under `../shared/data/`, which must exist.
pub fn shared_file(rel: &str) -> PathBuf {
    let p = shared_dir().join("data").join(rel);
    assert!(
        p.is_file(),
        "missing shared data file {} (needed by this test)",
        p.display()
    );
    p
}

/// A file under `estimator/models/`.
pub fn model_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name)
}

/// The MLP sidecar as JSON.
pub fn sidecar() -> serde_json::Value {
    let text = std::fs::read_to_string(model_file("gpumemnet-mlp.json")).expect("sidecar");
    serde_json::from_str(&text).expect("sidecar JSON")
}
