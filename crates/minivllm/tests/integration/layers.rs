//! The layering rule of `docs/architecture.md`, checked on the sources: a module of
//! `crates/minivllm/src` imports only from its own layer or from the layers below it, so
//! that the model executor can be driven without the engine (by a tensor-parallel worker,
//! or from Python) and the engine changes without touching the kernels. Test code (files
//! named `tests.rs` and the `#[cfg(test)]` module that ends a file) may import anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module of the crate and its layer: higher layers import lower ones.
const LAYERS: &[(&str, u32)] = &[
    ("entrypoints", 70),
    ("engine", 60),
    // The model runner and its persistent batch, which run what the scheduler hands them
    // (as vLLM v1's worker reads the scheduler's output) and sample.
    ("worker", 55),
    // The scheduler and KV cache manager, beside the engine, which drives them.
    ("core", 50),
    // Request-level objects that the engine, the scheduler and the API share.
    ("outputs", 45),
    ("sequence", 42),
    // The contract a structured-output grammar meets, which a sequence may carry.
    ("structured_output", 41),
    // Reasoning models' `<think>` text: how the engine constrains after it and the API
    // splits it off. Plain text handling, importing nothing of the crate.
    ("reasoning", 41),
    // Speculative decoding's record of each sequence's guesses and the draft-length rule:
    // arithmetic a sequence carries and the scheduler applies.
    ("spec_decode", 41),
    ("sampling_params", 40),
    ("model_executor", 20),
    // Shared by every layer: plain data and ids, importing nothing above.
    ("config", 10),
    // Tensor parallelism's collectives, which the model's layers call.
    ("distributed", 8),
    ("ids", 5),
    ("utils", 5),
    // The kernels crate, re-exported.
    ("kernels", 0),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, but test files.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    rust_files(dir, out);
    out.retain(|p| p.file_name().is_some_and(|n| n != "tests.rs"));
}

/// Every `.rs` file under `dir`, test files included.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The file's text before the test module that closes it. Test-only items elsewhere in the
/// file (a `#[cfg(test)]` helper) count as code: the file holds them.
fn non_test_code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read source");
    test_module_start(&text).map_or(text.clone(), |at| text[..at].to_string())
}

/// Where the closing `#[cfg(test)] mod …` starts: the last `#[cfg(test)]` that is followed
/// by a module.
fn test_module_start(text: &str) -> Option<usize> {
    text.rmatch_indices("#[cfg(test)]")
        .find(|(at, m)| {
            let rest = text[at + m.len()..].trim_start();
            rest.starts_with("mod ") || rest.starts_with("pub(crate) mod ")
        })
        .map(|(at, _)| at)
}

#[test]
fn only_the_closing_test_module_is_set_aside() {
    let text = "fn a() {}\n#[cfg(test)]\nfn helper() {}\nfn b() {}\n#[cfg(test)]\nmod tests {}\n";
    let at = test_module_start(text).unwrap();
    assert!(text[..at].contains("fn helper") && text[..at].contains("fn b"));
    assert!(text[at..].starts_with("#[cfg(test)]\nmod tests"));
    assert_eq!(
        test_module_start("fn a() {}\n#[cfg(test)]\nfn helper() {}\n"),
        None
    );
}

/// The top-level module a file belongs to (`engine` for `src/engine/llm_engine.rs`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).expect("under src");
    let first = rel.components().next().expect("non-empty path");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// The top-level modules named after `crate::` in `code`.
fn imports(code: &str) -> Vec<String> {
    code.match_indices("crate::")
        .map(|(at, m)| {
            code[at + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .collect()
}

#[test]
fn every_module_imports_only_from_its_layer_or_below() {
    let layer: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    sources(&src(), &mut files);
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut wrong = Vec::new();
    for f in &files {
        let from = module_of(f);
        if from == "lib" || from == "testing" {
            continue;
        }
        let Some(&own) = layer.get(from.as_str()) else {
            wrong.push(format!(
                "{}: module {from} has no layer in LAYERS",
                f.display()
            ));
            continue;
        };
        let code = non_test_code(f);
        assert!(
            !code.contains("crate::{") && !code.contains("super::super"),
            "{}: grouped `crate::{{..}}` or `super::super` imports hide their layer; name each path",
            f.display()
        );
        for to in imports(&code) {
            match layer.get(to.as_str()) {
                _ if to == from || to.is_empty() => {}
                Some(&l) if l < own => {}
                _ => wrong.push(format!("{} ({from}) imports crate::{to}", f.display())),
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "imports against the layering rule:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_an_upward_import() {
    assert_eq!(
        imports("use crate::engine::x;\nlet y = crate::ids::TokenId;"),
        ["engine", "ids"]
    );
    let f = src()
        .join("model_executor")
        .join("layers")
        .join("sampler.rs");
    assert_eq!(module_of(&f), "model_executor");
}

/// Lines of code (not blank, not comments) in `text`.
fn lines_of_code(text: &str) -> usize {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count()
}

/// Lines of code before the file's test module.
fn code_lines(path: &Path) -> usize {
    lines_of_code(&non_test_code(path))
}

/// One concept per file: no Rust file of the three crates grows past 600 lines of code, its
/// test module included (a file whose tests would take it past moves them to a `tests.rs`
/// beside it, which is held to the same bound).
#[test]
fn no_source_file_is_over_600_lines_of_code() {
    const LIMIT: usize = 600;
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    rust_files(&src().join("../../minivllm-kernels/src"), &mut files);
    rust_files(&src().join("../../minivllm-cli/src"), &mut files);
    let mut big: Vec<String> = files
        .iter()
        .map(|f| {
            (
                lines_of_code(&std::fs::read_to_string(f).expect("read source")),
                f,
            )
        })
        .filter(|(n, _)| *n > LIMIT)
        .map(|(n, f)| format!("{}: {n} lines of code", f.display()))
        .collect();
    big.sort();
    assert!(
        big.is_empty(),
        "over {LIMIT} lines of code:\n{}",
        big.join("\n")
    );
}

/// The engine's step reads top-down in one screen: its parts live in their own files.
#[test]
fn llm_engine_is_under_300_lines_of_code() {
    let n = code_lines(&src().join("engine/llm_engine.rs"));
    assert!((100..300).contains(&n), "llm_engine.rs: {n} lines of code");
}
