//! Helpers the CLI test files share.

use std::path::PathBuf;

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
