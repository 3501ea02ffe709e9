//! Helpers the CLI test files share.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Sets its flag when dropped: a scope whose bystander thread loops until a flag is set
/// sets it however the scope ends, so a failed assertion fails the test instead of leaving
/// the scope waiting for the bystander forever.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

pub fn model() -> String {
    let path = std::env::var_os("MINIVLLM_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "test model missing: run `minivllm download-default-model`"
    );
    path.to_str().unwrap().to_string()
}
