//! Where the tests find the test model and the reference outputs; shared by unit and
//! integration tests (not part of the engine's API).

use std::path::PathBuf;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The test model (SmolLM2-135M-Instruct Q4_1 GGUF), from `MINIVLLM_TEST_MODEL` or
/// `<workspace>/models/`. Missing is a failure, not a skip: a test that passes without its
/// model guards nothing.
pub fn test_model_path() -> PathBuf {
    let path = std::env::var_os("MINIVLLM_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        path.is_file(),
        "test model {} is missing: run `cargo run -p minivllm-cli -- download-default-model` \
         (or set MINIVLLM_TEST_MODEL)",
        path.display()
    );
    path
}

/// Whether the developer opted out of the tests that need `need` (`models`: the real files
/// beyond the default model; `mpi`; `browser`; `netns`: network namespaces) by naming it in
/// `MINIVLLM_SKIP` (space- or comma-separated).
pub(crate) fn opted_out(need: &str) -> bool {
    std::env::var("MINIVLLM_SKIP").is_ok_and(|v| v.split([' ', ',']).any(|n| n.trim() == need))
}

/// For a test that cannot run because `missing` (named `need` in `MINIVLLM_SKIP`) is not on
/// this machine: fails saying what is missing, unless the developer opted out of `need`, in
/// which case it prints `SKIPPED` and returns (and the test then returns too). A test that
/// passes without what it tests guards nothing, so skipping takes an explicit flag.
pub fn skip_or_fail(need: &str, test: &str, missing: &str) {
    if opted_out(need) {
        eprintln!("SKIPPED {test}: {missing} (MINIVLLM_SKIP={need})");
        return;
    }
    panic!(
        "{test}: {missing}. `./scripts/test.sh` fetches the models and says what to install; \
         MINIVLLM_SKIP={need} skips the tests that need it"
    );
}

/// The real model `file` under `<workspace>/models/`, which `minivllm download-model <name>`
/// fetches (as `scripts/test.sh` does); when it is not there, [`skip_or_fail`] for `models`
/// and `None`.
pub fn real_model(file: &str, name: &str, test: &str) -> Option<PathBuf> {
    let path = workspace_root().join("models").join(file);
    if path.is_file() {
        return Some(path);
    }
    let missing = format!(
        "{} is not downloaded (`minivllm download-model {name}`)",
        path.display()
    );
    skip_or_fail("models", test, &missing);
    None
}

/// The Hugging Face reference outputs and tokenizer folder, committed in `tests/data/reference`
/// (a copy of the team's `shared/reference`) so a lone clone tests itself; `MINIVLLM_REFERENCE_DIR`
/// points elsewhere. Missing fails.
pub fn reference_dir() -> PathBuf {
    let dir = std::env::var_os("MINIVLLM_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("tests/data/reference"));
    assert!(
        dir.join("smollm2_greedy_hf.json").is_file(),
        "reference outputs not found in {} (set MINIVLLM_REFERENCE_DIR)",
        dir.display()
    );
    dir
}

/// Block tables for a sequence run without a KV cache manager over a cache of `groups` KV cache
/// groups: group `g` gets block `b · groups + g` for each block `b` of `table`, so no two
/// groups share a block and each group's blocks lie between other groups' (as a KV cache
/// manager hands them out), where a layer that reached past its blocks would write into
/// another group's. The cache needs `groups` blocks for each of `table`'s.
pub fn group_tables(table: &[crate::ids::BlockId], groups: usize) -> Vec<Vec<crate::ids::BlockId>> {
    (0..groups as u32)
        .map(|g| {
            table
                .iter()
                .map(|b| crate::ids::BlockId(b.0 * groups as u32 + g))
                .collect()
        })
        .collect()
}

/// A sampled `token` with no logprobs asked for: what a step without a model "samples" in
/// the scheduler's tests.
pub fn sampled(token: crate::ids::TokenId) -> crate::outputs::SampledToken {
    crate::outputs::SampledToken {
        token_id: token,
        logprob: 0.0,
        top_logprobs: Vec::new(),
        rank: None,
    }
}

/// The ends of `text`'s prefixes, a character at a time (the last is the whole text): how
/// the streaming parsers' tests feed a reply as it grows.
pub fn prefix_ends(text: &str) -> impl Iterator<Item = usize> + '_ {
    text.char_indices()
        .map(|(i, _)| i)
        .skip(1)
        .chain([text.len()])
}
