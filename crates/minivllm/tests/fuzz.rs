//! Property tests over hostile input: GGUF files with bytes and metadata values mutated,
//! Hugging Face `config.json` values replaced, request bodies with any field set to any
//! JSON, and random bytes and text through the tokenizer and detokenizer. Every case must
//! end in a value or an error: a panic fails the test, an abort or a hang fails the run,
//! and so does any single allocation above [`ALLOCATION_BOUND`] (the inputs are a few
//! kilobytes: a larger allocation is sized by a number the input claims, not by the input).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use minivllm::config::ModelConfig;
use minivllm::engine::detokenizer::{DetokenizerConfig, IncrementalDetokenizer};
use minivllm::engine::stop_strings::StopStrings;
use minivllm::engine::tokenizer::Tokenizer;
use minivllm::entrypoints::anthropic::protocol::MessagesRequest;
use minivllm::entrypoints::openai::protocol::{ChatCompletionRequest, CompletionRequest};
use minivllm::entrypoints::openai::responses::protocol::ResponsesRequest;
use minivllm::entrypoints::openai::serving_embedding::EmbeddingRequest;
use minivllm::model_executor::loader::gguf::{GgufFile, GgufValue};
use minivllm::model_executor::loader::gguf_weights::config_from_gguf;
use minivllm::model_executor::loader::gguf_writer::{write_gguf, TensorEntry};
use minivllm_kernels::quant::GgmlType;
use proptest::prelude::*;
use serde_json::{json, Value};

/// The largest single allocation any case may make.
const ALLOCATION_BOUND: usize = 64 << 20;

/// The system allocator, noting the largest allocation asked of it on each thread.
struct Counting;

thread_local! {
    /// Per thread, since the tests of this file run side by side: a case's own largest
    /// allocation, not another test's.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: a thread being torn down may still allocate.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every method forwards to the system allocator with the caller's arguments, so
// the caller's contract is the system allocator's; the counter is a thread-local max.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Starts a case: what earlier cases on this thread allocated is forgotten.
fn reset_allocations() {
    LARGEST.with(|l| l.set(0));
}

/// Fails if any allocation of this case (since `reset_allocations`) passed the bound.
fn assert_allocations_bounded() {
    let largest = LARGEST.with(Cell::get);
    assert!(
        largest <= ALLOCATION_BOUND,
        "an allocation of {largest} bytes (bound {ALLOCATION_BOUND})"
    );
}

/// The test model's metadata but for its vocabulary (a few tokens instead of 49,152, so
/// each case writes and parses a small file).
fn base_metadata() -> &'static BTreeMap<String, GgufValue> {
    static META: OnceLock<BTreeMap<String, GgufValue>> = OnceLock::new();
    META.get_or_init(|| {
        let f = GgufFile::open(&common::test_model_path()).unwrap();
        let mut m = f.metadata.clone();
        for (key, keep) in [("tokenizer.ggml.tokens", 8), ("tokenizer.ggml.merges", 4)] {
            if let Some(GgufValue::Array(v)) = m.get_mut(key) {
                v.truncate(keep);
            }
        }
        m.remove("tokenizer.ggml.token_type");
        m.remove("tokenizer.chat_template");
        m
    })
}

/// A small GGUF file with `metadata` and two tiny tensors, as bytes.
fn gguf_bytes(metadata: &BTreeMap<String, GgufValue>) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.gguf");
    let tensors = [
        TensorEntry {
            name: "blk.0.attn_norm.weight".into(),
            dims: vec![8],
            ty: GgmlType::F32,
        },
        TensorEntry {
            name: "token_embd.weight".into(),
            dims: vec![32, 2],
            ty: GgmlType::Q8_0,
        },
    ];
    write_gguf(&path, metadata, &tensors, 32, |i| Ok(vec![0; [32, 68][i]])).unwrap();
    std::fs::read(&path).unwrap()
}

/// Opens `bytes` as a GGUF file and reads a model config from it, if it opens.
fn open_and_configure(bytes: &[u8]) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, bytes).unwrap();
    if let Ok(file) = GgufFile::open(f.path()) {
        if let Ok(cfg) = config_from_gguf(&file) {
            assert!(cfg.validate().is_ok());
        }
        for t in &file.tensors {
            let _ = file.dequantize_tensor(t);
        }
    }
}

/// Any GGUF value, edge cases included.
fn gguf_value() -> impl Strategy<Value = GgufValue> {
    let leaf = prop_oneof![
        any::<u8>().prop_map(GgufValue::U8),
        any::<i8>().prop_map(GgufValue::I8),
        any::<u32>().prop_map(GgufValue::U32),
        any::<i32>().prop_map(GgufValue::I32),
        prop_oneof![Just(0u64), Just(1 << 40), Just(u64::MAX), any::<u64>()]
            .prop_map(GgufValue::U64),
        any::<i64>().prop_map(GgufValue::I64),
        prop_oneof![
            Just(f32::NAN),
            Just(f32::INFINITY),
            Just(-0.0f32),
            Just(1e-45),
            any::<f32>()
        ]
        .prop_map(GgufValue::F32),
        any::<f64>().prop_map(GgufValue::F64),
        any::<bool>().prop_map(GgufValue::Bool),
        ".{0,12}".prop_map(GgufValue::String),
    ];
    prop_oneof![
        4 => leaf.clone(),
        1 => prop::collection::vec(leaf, 0..6).prop_map(|v| {
            // GGUF arrays are homogeneous: keep the first element's kind.
            let first = v.first().map(GgufValue::type_id);
            GgufValue::Array(v.into_iter().filter(|x| Some(x.type_id()) == first).collect())
        }),
    ]
}

/// Any JSON value: nulls, booleans, edge numbers, strings, and small arrays and objects.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![
            Just(0i64),
            Just(-1),
            Just(i64::MAX),
            Just(i64::MIN),
            any::<i64>()
        ]
        .prop_map(Value::from),
        prop_oneof![Just(u64::MAX), Just(1 << 40), any::<u64>()].prop_map(Value::from),
        prop_oneof![Just(1e308f64), Just(-0.0), Just(1e-300), any::<f64>()]
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const REQUEST_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "best_of",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stream",
    "stream_options",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "echo",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "priority",
    "add_generation_prompt",
    "system",
    "stop_sequences",
    "tools",
    "tool_choice",
    "input",
    "instructions",
    "max_output_tokens",
    "text",
    "previous_response_id",
    "include",
    "top_logprobs",
    "encoding_format",
    "dimensions",
    "normalize",
    "unknown_field",
];

/// What the server does with a body before the engine: parse, check, build and validate
/// the sampling parameters, and fit them to a prompt.
fn check_request(body: &Value) {
    if let Ok(req) = serde_json::from_value::<CompletionRequest>(body.clone()) {
        if req.common.check().is_ok() {
            let mut p =
                req.common
                    .sampling_params(&Default::default(), req.max_tokens, req.logprobs);
            if p.validate().is_ok() && p.validate_for_model(49152, 20).is_ok() {
                let _ = p.max_tokens_for(10, 1024).map(|m| p.max_tokens = Some(m));
            }
        }
    }
    // Anthropic's Messages body, read as the chat request it runs as.
    let anthropic = serde_json::from_value::<MessagesRequest>(body.clone())
        .ok()
        .and_then(|m| m.to_chat(true).ok());
    let responses = serde_json::from_value::<ResponsesRequest>(body.clone())
        .ok()
        .and_then(|r| r.to_chat().ok());
    if let Ok(e) = serde_json::from_value::<EmbeddingRequest>(body.clone()) {
        let _ = (e.input.len(), e.dimensions, e.normalize);
    }
    let chat = serde_json::from_value::<ChatCompletionRequest>(body.clone()).ok();
    for req in [chat, anthropic, responses].into_iter().flatten() {
        if req.check().is_ok() {
            let _ = minivllm::entrypoints::openai::protocol::chat_messages(&req.messages);
            let logprobs = req.logprobs.then_some(req.top_logprobs.unwrap_or(0));
            let p = req
                .common
                .sampling_params(&Default::default(), req.max_tokens, logprobs);
            let _ = p.validate().and_then(|()| p.validate_for_model(49152, 20));
        }
    }
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_hf_dir(&common::reference_dir().join("smollm2-hf")).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random bytes overwritten anywhere in a valid file, and random truncations.
    #[test]
    fn gguf_with_bytes_mutated_opens_or_fails_cleanly(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        reset_allocations();
        let mut bytes = gguf_bytes(base_metadata()).clone();
        for (at, b) in flips {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len()));
        }
        open_and_configure(&bytes);
        assert_allocations_bounded();
    }

    /// One metadata key (the model's numbers, or any key) set to any value.
    #[test]
    fn gguf_with_a_metadata_value_replaced_configures_or_fails_cleanly(
        key in prop::sample::select(base_metadata().keys().cloned().collect::<Vec<_>>()),
        value in gguf_value(),
    ) {
        reset_allocations();
        let mut m = base_metadata().clone();
        m.insert(key, value);
        open_and_configure(&gguf_bytes(&m));
        assert_allocations_bounded();
    }

    /// One or more `config.json` values replaced by any JSON.
    #[test]
    fn hf_config_with_values_replaced_loads_or_fails_cleanly(
        edits in prop::collection::vec((any::<prop::sample::Index>(), json_value()), 1..4),
    ) {
        reset_allocations();
        let path = common::reference_dir().join("smollm2-hf/config.json");
        let mut config: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let keys: Vec<String> = config.as_object().unwrap().keys().cloned().collect();
        for (k, v) in edits {
            config[&keys[k.index(keys.len())]] = v;
        }
        if let Ok(cfg) = ModelConfig::from_hf_json(&config) {
            let _ = cfg.validate();
        }
        assert_allocations_bounded();
    }

    /// Request bodies with any fields set to any JSON.
    #[test]
    fn request_bodies_with_any_field_values_are_checked_cleanly(
        edits in prop::collection::vec((prop::sample::select(REQUEST_FIELDS), json_value()), 1..5),
    ) {
        reset_allocations();
        let mut completion = json!({"prompt": "Hi", "max_tokens": 4});
        let mut chat = json!({"messages": [{"role": "user", "content": "Hi"}]});
        let mut anthropic = json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Hi"}]}]});
        let mut responses = json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "Hi"}]}], "max_output_tokens": 4});
        for (field, v) in edits {
            completion[field] = v.clone();
            chat[field] = v.clone();
            anthropic[field] = v.clone();
            responses[field] = v;
        }
        check_request(&completion);
        check_request(&chat);
        check_request(&anthropic);
        check_request(&responses);
        assert_allocations_bounded();
    }

    /// Random bytes (as text, lossily) and random Unicode round the tokenizer.
    #[test]
    fn tokenizer_takes_any_text(bytes in prop::collection::vec(any::<u8>(), 0..256), text in "\\PC{0,64}") {
        let tok = tokenizer();
        reset_allocations();
        for t in [String::from_utf8_lossy(&bytes).into_owned(), text] {
            let ids = tok.encode(&t, true).unwrap();
            let back = tok.decode(&ids, false).unwrap();
            prop_assert!(!back.is_empty() || t.is_empty() || ids.len() <= 1);
        }
        assert_allocations_bounded();
    }

    /// Any token ids, pushed one at a time with any stop strings: the visible text is
    /// always a prefix of the output, and ids outside the vocabulary are errors.
    #[test]
    fn detokenizer_takes_any_ids(
        ids in prop::collection::vec(0u32..49_200, 0..48),
        stop in prop::collection::vec("\\PC{1,4}", 0..3),
        include in any::<bool>(),
    ) {
        let tok = tokenizer();
        reset_allocations();
        let cfg = DetokenizerConfig { stop: StopStrings::new(&stop), include_stop_str_in_output: include, ..DetokenizerConfig::default() };
        let mut d = IncrementalDetokenizer::new(tok, &[1, 2, 3], cfg);
        for id in ids {
            match d.push(tok, id) {
                Ok(_) => prop_assert!(d.output_text().starts_with(d.visible_text())),
                Err(_) => prop_assert!(id as usize >= tok.vocab_size()),
            }
        }
        d.finish();
        prop_assert_eq!(d.visible_text(), d.output_text());
        assert_allocations_bounded();
    }
}

/// The unmutated inputs are valid, so the mutations above start from files and bodies that
/// get past every check.
#[test]
fn the_unmutated_inputs_are_accepted() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, &gguf_bytes(base_metadata())).unwrap();
    let file = GgufFile::open(f.path()).unwrap();
    assert_eq!(config_from_gguf(&file).unwrap().num_hidden_layers, 30);
    let req: CompletionRequest =
        serde_json::from_value(json!({"prompt": "Hi", "max_tokens": 4})).unwrap();
    req.common.check().unwrap();
    req.common
        .sampling_params(&Default::default(), req.max_tokens, None)
        .validate()
        .unwrap();
}
