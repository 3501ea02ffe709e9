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
    // The model runner and its state of each sequence, which run what the scheduler hands
    // them (as vLLM v1's worker reads the scheduler's output) and sample.
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
    // Tensor parallelism's collectives, which the model's layers call, and the KV transfer
    // between engines (bytes and sockets).
    ("distributed", 8),
    ("ids", 5),
    ("utils", 5),
    // The kernels crate, re-exported.
    ("kernels", 0),
];

pub(crate) fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, but test files.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    rust_files(dir, out);
    out.retain(|p| p.file_name().is_some_and(|n| n != "tests.rs"));
}

/// Every `.rs` file under `dir`, test files included.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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
        // `crate::` paths, and every path followed to its file (`super::`, groups).
        let files = file_imports(&code, &module_path(f));
        let reached = files.iter().map(|t| module_of(t));
        for to in imports(&code).into_iter().chain(reached) {
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

/// The module path of a source file (`["engine", "llm_engine"]`; a `mod.rs` is its folder's).
pub(crate) fn module_path(path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(src()).expect("under src");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The source file that defines module `path`, if there is one.
fn module_file(path: &[String]) -> Option<PathBuf> {
    let base = path.iter().fold(src(), |p, s| p.join(s));
    if path.is_empty() {
        return Some(src().join("lib.rs"));
    }
    [base.with_extension("rs"), base.join("mod.rs")]
        .into_iter()
        .find(|p| p.is_file())
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The files the path at the start of `rest` names, read from module `path`: each segment
/// followed as deep as modules go (what is left names items of the last module), a
/// `{..}` group item by item. The crate root's re-exports are the public surface, not a
/// module the others sit on, so `lib.rs` is left out.
fn resolve(mut rest: &str, mut path: Vec<String>, out: &mut Vec<PathBuf>) {
    let mut file = module_file(&path);
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item) = (0usize, 0);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth > 0 => depth -= 1,
                    ',' | '}' if depth == 0 => {
                        resolve(group[item..i].trim_start(), path.clone(), out);
                        if c == '}' {
                            return;
                        }
                        item = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let name = ident(rest);
        if name.is_empty() {
            break;
        }
        path.push(name.to_string());
        match module_file(&path) {
            Some(f) => file = Some(f),
            None => break,
        }
        match rest[name.len()..].strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out.extend(file.filter(|f| !f.ends_with("src/lib.rs")));
}

/// The files `code` (the file at module `own`) names through `crate::`, `super::` and
/// `self::` paths. Comments are left out (doc links name what they explain, not what the
/// code uses).
fn file_imports(code: &str, own: &[String]) -> Vec<PathBuf> {
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let starts = (code.match_indices("crate::"))
        .chain(code.match_indices("super::"))
        .chain(code.match_indices("self::"));
    for (at, _) in starts {
        // Part of a longer name (`my_crate::`, `Self::`, a `super::` after `super::`).
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut rest = &code[at..];
        let path = if let Some(r) = rest.strip_prefix("crate::") {
            rest = r;
            Vec::new()
        } else if let Some(r) = rest.strip_prefix("self::") {
            rest = r;
            own.to_vec()
        } else {
            let mut p = own.to_vec();
            while let Some(r) = rest.strip_prefix("super::") {
                p.pop();
                rest = r;
            }
            p
        };
        resolve(rest, path, &mut out);
    }
    out
}

/// Strongly connected groups of more than one file in `graph` (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<PathBuf, Vec<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        graph: &'a BTreeMap<PathBuf, Vec<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: std::collections::BTreeSet<&'a PathBuf>,
        groups: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.push(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.groups.push(group);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: Default::default(),
        groups: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.groups
}

/// The crate's files import each other without cycles: a file can be read, changed and
/// tested knowing only what it imports (the routes do not import the router that assembles
/// them, a layer's parts sit on each other in one order).
#[test]
fn no_file_level_import_cycles() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let graph: BTreeMap<PathBuf, Vec<PathBuf>> = files
        .iter()
        .map(|f| {
            let own = module_path(f);
            let mut to = file_imports(&non_test_code(f), &own);
            to.retain(|t| t != f);
            to.sort();
            to.dedup();
            (f.clone(), to)
        })
        .collect();
    let found: Vec<String> = cycles(&graph)
        .iter()
        .map(|g| {
            let names: Vec<String> = g
                .iter()
                .map(|f| f.strip_prefix(src()).unwrap().display().to_string())
                .collect();
            names.join(" <-> ")
        })
        .collect();
    assert!(
        found.is_empty(),
        "{} import cycles between files:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_cycle_check_follows_paths_and_finds_a_cycle() {
    let own = ["entrypoints", "openai", "serving_chat"].map(String::from);
    let mut files = file_imports(
        "use super::chat_run::{run_chat, ChatRun};\nuse crate::sequence::FinishReason;\n\
         // use crate::engine::llm_engine::X;\n\
         use crate::model_executor::loader::{weights::WeightSource, LoadError};\n",
        &own,
    );
    // Each item of a group reaches its file.
    files.dedup();
    assert_eq!(
        files,
        [
            src().join("sequence.rs"),
            src().join("model_executor/loader/weights.rs"),
            src().join("model_executor/loader/mod.rs"),
            src().join("entrypoints/openai/chat_run.rs")
        ]
    );
    let (a, b, c) = (PathBuf::from("a"), PathBuf::from("b"), PathBuf::from("c"));
    let graph = BTreeMap::from([
        (a.clone(), vec![b.clone()]),
        (b.clone(), vec![a.clone()]),
        (c.clone(), vec![a.clone()]),
    ]);
    assert_eq!(cycles(&graph), [vec![a, b]]);
}

fn repo() -> PathBuf {
    src().join("../../..")
}

/// `docs/architecture.md` maps every source file of the four crates (its file map, which
/// `scripts/file_map.py` regenerates from the files' module docs).
#[test]
fn the_architecture_doc_maps_every_source_file() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).expect("read doc");
    let crates = repo().join("crates");
    let mut missing = Vec::new();
    for krate in [
        "minivllm",
        "minivllm-kernels",
        "minivllm-cli",
        "minivllm-py",
    ] {
        let mut files = Vec::new();
        sources(&crates.join(krate).join("src"), &mut files);
        assert!(!files.is_empty(), "no sources in {krate}");
        for f in files {
            let rel = f.strip_prefix(&crates).unwrap().display().to_string();
            if !doc.contains(&format!("`{rel}`")) {
                missing.push(rel);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md's file map lacks (run python3 scripts/file_map.py):\n{}",
        missing.join("\n")
    );
}

/// The `.rs` files a text names (`engine/llm_engine.rs`, `llama.rs`).
fn named_rust_files(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices(".rs") {
        let end = at + 3;
        if text[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let start = text[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "_/.-".contains(c)))
            .map_or(0, |i| i + 1);
        if start < at {
            out.push(&text[start..end]);
        }
    }
    out
}

/// Every Rust file the architecture docs name exists: relative to the repository, a
/// crate or its `src`, or (a bare name) somewhere in the crates.
#[test]
fn the_architecture_docs_name_only_files_that_exist() {
    let mut all = Vec::new();
    rust_files(&repo().join("crates"), &mut all);
    let crates = [
        "minivllm",
        "minivllm-kernels",
        "minivllm-cli",
        "minivllm-py",
    ];
    let mut wrong = Vec::new();
    for doc in ["docs/architecture.md", "DEVELOPERS.md"] {
        let text = std::fs::read_to_string(repo().join(doc)).expect("read doc");
        for name in named_rust_files(&text) {
            let found = if name.contains('/') {
                let mut bases = vec![repo(), repo().join("crates")];
                for c in crates {
                    bases.push(repo().join("crates").join(c));
                    bases.push(repo().join("crates").join(c).join("src"));
                }
                bases.iter().any(|b| b.join(name).is_file())
                    || all.iter().any(|f| f.ends_with(name))
            } else {
                all.iter().any(|f| f.file_name().is_some_and(|n| n == name))
            };
            if !found {
                wrong.push(format!("{doc}: {name}"));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "the docs name files that do not exist:\n{}",
        wrong.join("\n")
    );
    assert_eq!(
        named_rust_files("see `engine/llm_engine.rs`, llama.rs and x.rsy"),
        ["engine/llm_engine.rs", "llama.rs"]
    );
}
