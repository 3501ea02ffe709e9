//! The crate's public surface is what other code uses: a module is `pub` only when the
//! other crates of the workspace (the CLI, the Python bindings), the integration tests or
//! the examples name it; every other module is `pub(crate)`, so that the compiler's
//! dead-code lint sees its items, and an item nobody uses is reported instead of kept.

use std::path::{Path, PathBuf};

use super::layers::{module_path, rust_files, src};

/// The Rust sources outside the library that may use it.
fn users() -> String {
    let crates = src().join("../..");
    let mut files = Vec::new();
    for dir in [
        "minivllm-cli",
        "minivllm-py",
        "minivllm/tests",
        "minivllm/examples",
    ] {
        let dir = crates.join(dir);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
    }
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
        .collect()
}

/// Whether `users` names the module `path` (`["engine", "tokenizer"]`): as
/// `minivllm::engine::tokenizer`, or inside `minivllm::engine::{.., tokenizer, ..}`.
fn is_named(users: &str, path: &[String]) -> bool {
    let (name, parent) = path.split_last().expect("a module path");
    let parent = std::iter::once("minivllm")
        .chain(parent.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::");
    let full = format!("{parent}::{name}");
    let word_end = |rest: &str| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_');
    let direct = users
        .match_indices(&full)
        .any(|(at, _)| word_end(&users[at + full.len()..]));
    let grouped = users
        .match_indices(&format!("{parent}::{{"))
        .any(|(at, m)| {
            let inside = &users[at + m.len()..];
            let inside = &inside[..inside.find('}').unwrap_or(inside.len())];
            inside
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|w| w == name)
        });
    direct || grouped
}

/// Each `pub mod name;` declared in `file`, as a module path.
fn public_modules(file: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).expect("read source");
    let parent = module_path(file);
    text.lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(|name| parent.iter().cloned().chain([name.to_string()]).collect())
        .collect()
}

#[test]
fn every_public_module_is_used_outside_the_crate() {
    let users = users();
    let mut files: Vec<PathBuf> = Vec::new();
    rust_files(&src(), &mut files);
    let unused: Vec<String> = files
        .iter()
        .flat_map(|f| public_modules(f))
        .filter(|path| !is_named(&users, path))
        .map(|path| path.join("::"))
        .collect();
    assert!(
        unused.is_empty(),
        "`pub mod` that no other crate, test or example uses (make them pub(crate)): {unused:?}"
    );
}

#[test]
fn the_check_sees_direct_and_grouped_uses() {
    let users = "use minivllm::engine::tokenizer::Tokenizer;\nuse minivllm::core::{policy, scheduler::Scheduler};";
    let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    assert!(is_named(users, &path("engine::tokenizer")));
    assert!(is_named(users, &path("core::policy")));
    assert!(is_named(users, &path("core::scheduler")));
    assert!(!is_named(users, &path("engine::token")));
    assert!(!is_named(users, &path("core::seq_queue")));
}
