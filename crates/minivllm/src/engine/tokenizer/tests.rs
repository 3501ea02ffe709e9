use std::path::Path;

use super::gguf_bpe::merges_from_scores;
use super::*;

const SMOLLM2_SYSTEM: &str =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

fn smollm2_hf_dir() -> Option<std::path::PathBuf> {
    Some(crate::testing::reference_dir().join("smollm2-hf"))
}

/// The tokenizer spec read from the real GGUF's `tokenizer.ggml.*` metadata.
fn smollm2_gguf_spec() -> Option<GgufTokenizerSpec> {
    let file =
        crate::model_executor::loader::gguf::GgufFile::open(&crate::testing::test_model_path())
            .unwrap();
    Some(super::gguf_tokenizer_spec(&file.metadata).unwrap())
}

#[derive(Deserialize)]
struct Reference {
    results: Vec<ReferenceResult>,
}

#[derive(Deserialize)]
struct ReferenceResult {
    kind: String,
    prompt: String,
    prompt_ids: Vec<u32>,
    #[serde(default)]
    messages: Vec<ChatMessage>,
}

#[test]
fn smollm2_hf_folder_reproduces_reference_prompt_ids() {
    let Some(dir) = smollm2_hf_dir() else { return };
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_ids(), &[2]);
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert!(!tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.vocab_size(), 49152);

    let path = crate::testing::reference_dir().join("smollm2_greedy_hf.json");
    let reference: Reference =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(!reference.results.is_empty());
    for r in &reference.results {
        match r.kind.as_str() {
            "raw" => {}
            "chat" => {
                let rendered = tok.apply_chat_template(&r.messages, true).unwrap();
                assert_eq!(rendered, r.prompt);
            }
            other => panic!("unknown reference kind {other}"),
        }
        let ids = tok.encode(&r.prompt, true).unwrap();
        assert_eq!(ids, r.prompt_ids, "prompt {:?}", r.prompt);
        assert_eq!(tok.decode(&r.prompt_ids, false).unwrap(), r.prompt);
    }
}

#[test]
fn smollm2_template_renders_default_system_prompt() {
    let Some(dir) = smollm2_hf_dir() else { return };
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    let out = tok
        .apply_chat_template(&[ChatMessage::new("user", "Hi")], false)
        .unwrap();
    assert_eq!(
        out,
        format!("{SMOLLM2_SYSTEM}<|im_start|>user\nHi<|im_end|>\n")
    );
}

const VARIED_TEXTS: &[&str] = &[
    "",
    " ",
    "Hello, world!",
    "The capital of France is",
    "   leading spaces and trailing spaces   ",
    "tabs\tand\ttabs\t\t\tand\nnewlines\r\nand\n\n\nruns",
    "a  2, b   33, c\t4",
    "numbers 1234567890 3.14159 -42 1e10 0x1F 2024-01-22",
    "émigré café naïve Ünïcödé mañana façade",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷 ❤️",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() { println!(\"{}\", x.iter().map(|v| v * 2).sum::<i32>()); }",
    "I'm sure you're right, they'll see it's what we've DONE'S",
    "URL: https://example.com/a/b?c=d&e=f#g",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<empty_output> and <|im_start|",
    "zero\u{200b}width and\u{a0}nbsp and \u{301}combining",
];

#[test]
fn gguf_and_hf_tokenizers_agree() {
    let Some(dir) = smollm2_hf_dir() else { return };
    let Some(spec) = smollm2_gguf_spec() else {
        return;
    };
    let hf = Tokenizer::from_hf_dir(&dir).unwrap();
    let gguf = Tokenizer::from_gguf_spec(&spec).unwrap();
    assert_eq!(gguf.vocab_size(), hf.vocab_size());
    assert_eq!(gguf.bos_token_id(), hf.bos_token_id());
    assert_eq!(gguf.eos_token_ids(), hf.eos_token_ids());
    assert_eq!(gguf.bos_token(), hf.bos_token());
    assert_eq!(gguf.eos_token(), hf.eos_token());
    assert_eq!(gguf.add_bos(), hf.add_bos());
    assert_eq!(gguf.add_eos(), hf.add_eos());
    for text in VARIED_TEXTS {
        let ids = hf.encode(text, true).unwrap();
        assert_eq!(gguf.encode(text, true).unwrap(), ids, "text {text:?}");
        assert_eq!(gguf.decode(&ids, false).unwrap(), *text);
        assert_eq!(
            gguf.decode(&ids, true).unwrap(),
            hf.decode(&ids, true).unwrap()
        );
    }
    let im_start = hf.encode("<|im_start|>", false).unwrap();
    assert_eq!(im_start, vec![1]);
    let messages = [ChatMessage::new("user", "Hi")];
    assert_eq!(
        gguf.apply_chat_template(&messages, true).unwrap(),
        hf.apply_chat_template(&messages, true).unwrap()
    );
}

/// A tiny SentencePiece vocabulary: control tokens, all 256 byte tokens, and pieces whose
/// scores make "▁hello" and "▁world" reachable by merges.
fn tiny_llama_spec() -> GgufTokenizerSpec {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut token_types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        token_types.push(6);
        scores.push(0.0);
    }
    let pieces: &[(&str, f32)] = &[
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -3.0),
        ("l", -4.0),
        ("o", -5.0),
        ("w", -6.0),
        ("r", -7.0),
        ("d", -8.0),
        ("he", -10.0),
        ("ll", -11.0),
        ("llo", -12.0),
        ("▁he", -13.0),
        ("▁hello", -14.0),
        ("or", -15.0),
        ("wor", -16.0),
        ("ld", -17.0),
        ("world", -18.0),
        ("▁world", -19.0),
        ("<user>", 0.0),
    ];
    for (piece, score) in pieces {
        tokens.push(piece.to_string());
        token_types.push(if *piece == "<user>" { 4 } else { 1 });
        scores.push(*score);
    }
    GgufTokenizerSpec {
        model: "llama".into(),
        tokens,
        token_types,
        scores,
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        unk_token_id: Some(0),
        ..Default::default()
    }
}

fn ids_of(tok: &Tokenizer, pieces: &[&str]) -> Vec<u32> {
    pieces
        .iter()
        .map(|p| tok.token_to_id(p).unwrap_or_else(|| panic!("no token {p}")))
        .collect()
}

#[test]
fn sentencepiece_gguf_tokenizer_encodes_and_decodes() {
    let tok = Tokenizer::from_gguf_spec(&tiny_llama_spec()).unwrap();
    assert!(tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.bos_token(), Some("<s>"));

    let ids = tok.encode("hello world", true).unwrap();
    assert_eq!(ids, ids_of(&tok, &["<s>", "▁hello", "▁world"]));
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello world");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<s> hello world");

    // "é" is not a piece: its UTF-8 bytes fall back to byte tokens.
    let ids = tok.encode("hé", false).unwrap();
    assert_eq!(ids, ids_of(&tok, &["▁", "h", "<0xC3>", "<0xA9>"]));
    assert_eq!(tok.decode(&ids, false).unwrap(), "hé");

    // Control and user-defined tokens are never split; text after them gets its own `▁`.
    let ids = tok.encode("hello</s>world<user>", false).unwrap();
    assert_eq!(ids, ids_of(&tok, &["▁hello", "</s>", "▁world", "<user>"]));
    let ids = tok.encode("  hello", false).unwrap();
    assert_eq!(ids, ids_of(&tok, &["▁", "▁", "▁hello"]));
    assert_eq!(tok.decode(&ids, false).unwrap(), "  hello");
}

#[test]
fn sentencepiece_without_space_prefix() {
    let spec = GgufTokenizerSpec {
        add_space_prefix: Some(false),
        add_bos: Some(false),
        ..tiny_llama_spec()
    };
    let tok = Tokenizer::from_gguf_spec(&spec).unwrap();
    let ids = tok.encode("world hello", true).unwrap();
    assert_eq!(ids, ids_of(&tok, &["world", "▁hello"]));
    assert_eq!(tok.decode(&ids, false).unwrap(), "world hello");
}

#[test]
fn merges_follow_transformers_ranking() {
    let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0];
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = merges_from_scores(&tokens, &scores, &vocab);
    let expected = [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")];
    assert_eq!(
        merges,
        expected
            .iter()
            .map(|(l, r)| (l.to_string(), r.to_string()))
            .collect::<Vec<_>>()
    );
}

#[test]
fn gguf_spec_errors_are_descriptive() {
    let spec = GgufTokenizerSpec {
        model: "rwkv".into(),
        ..tiny_llama_spec()
    };
    let err = Tokenizer::from_gguf_spec(&spec).unwrap_err();
    assert!(
        matches!(&err, LoadError::Tokenizer(m) if m.contains("\"rwkv\"")),
        "{err}"
    );
    let spec = GgufTokenizerSpec {
        scores: vec![],
        ..tiny_llama_spec()
    };
    assert!(Tokenizer::from_gguf_spec(&spec).is_err());
    let spec = GgufTokenizerSpec {
        eos_token_id: Some(100_000),
        ..tiny_llama_spec()
    };
    assert!(Tokenizer::from_gguf_spec(&spec).is_err());
}

#[test]
fn missing_chat_template_is_a_clear_error() {
    let tok = Tokenizer::from_gguf_spec(&tiny_llama_spec()).unwrap();
    let err = tok
        .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
        .unwrap_err();
    assert_eq!(err, ChatTemplateError::Missing);
    assert!(err.to_string().contains("no chat template"));
}

#[test]
fn chat_template_from_gguf_uses_bos_and_eos_text() {
    let mut tok = Tokenizer::from_gguf_spec(&GgufTokenizerSpec {
        chat_template: Some(
            "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}{{ eos_token }}{% endfor %}"
                .into(),
        ),
        ..tiny_llama_spec()
    })
    .unwrap();
    let messages = [ChatMessage::new("user", " hi ")];
    assert_eq!(
        tok.apply_chat_template(&messages, false).unwrap(),
        "<s>[user] hi</s>"
    );
    tok.set_chat_template(Some("{% if %}".into()));
    assert!(matches!(
        tok.apply_chat_template(&messages, false),
        Err(ChatTemplateError::Syntax(_))
    ));
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn tokenizer_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
}

fn write_tokenizer_json(tok: &Tokenizer, dir: &Path) {
    tok.inner().save(dir.join("tokenizer.json"), false).unwrap();
}

#[test]
fn hf_folder_configs_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let built = Tokenizer::from_gguf_spec(&tiny_llama_spec()).unwrap();
    write_tokenizer_json(&built, dir.path());
    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "add_bos_token": true,
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "{{ messages[0].content }}"}
            ]
        }"#,
    );
    write(
        dir.path(),
        "generation_config.json",
        r#"{"bos_token_id": 1, "eos_token_id": [2, 0, 2]}"#,
    );
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_ids(), &[2, 0]);
    assert!(tok.add_bos() && !tok.add_eos());
    let messages = [ChatMessage::new("user", "x")];
    assert_eq!(tok.apply_chat_template(&messages, false).unwrap(), "x");
    assert_eq!(
        tok.encode("hello", true).unwrap(),
        built.encode("hello", true).unwrap()
    );

    // A chat_template.jinja file wins over the config's template.
    write(
        dir.path(),
        "chat_template.jinja",
        "J{{ messages[0].role }}\n",
    );
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.apply_chat_template(&messages, false).unwrap(), "Juser");

    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    assert!(matches!(
        Tokenizer::from_hf_dir(dir.path()),
        Err(LoadError::NotFound { .. })
    ));
}

#[test]
fn hf_folder_without_configs_probes_the_post_processor() {
    let dir = tempfile::tempdir().unwrap();
    let mut built = Tokenizer::from_gguf_spec(&tiny_llama_spec()).unwrap();
    // The way Llama 2's tokenizer.json adds BOS: a TemplateProcessing post-processor.
    let processor = tokenizers::processors::template::TemplateProcessing::builder()
        .try_single("<s> $A")
        .unwrap()
        .special_tokens(vec![("<s>", 1)])
        .build()
        .unwrap();
    built.inner.with_post_processor(Some(processor));
    write_tokenizer_json(&built, dir.path());
    write(
        dir.path(),
        "generation_config.json",
        r#"{"bos_token_id": 1, "eos_token_id": 2}"#,
    );
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert!(tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.bos_token(), Some("<s>"));
    assert_eq!(tok.eos_token(), Some("</s>"));
    // BOS once, not once from the post-processor and once from add_bos.
    assert_eq!(
        tok.encode("hello", true).unwrap(),
        ids_of(&tok, &["<s>", "▁hello"])
    );
}

/// GPT-2's byte-to-character table: printable Latin-1 stands for itself, every other byte
/// for a character from U+0100 up.
fn byte_level_alphabet() -> Vec<String> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                char::from(b).to_string()
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).unwrap().to_string()
            }
        })
        .collect()
}

fn tiny_gpt2_spec(pre: &str) -> GgufTokenizerSpec {
    let mut tokens = byte_level_alphabet();
    tokens.extend(["34", "12", "123", "<|end|>"].map(String::from));
    let mut token_types = vec![1; tokens.len()];
    *token_types.last_mut().unwrap() = 3;
    GgufTokenizerSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types,
        merges: ["3 4", "1 2", "12 3"].map(String::from).to_vec(),
        eos_token_id: Some(259),
        ..Default::default()
    }
}

/// o200k (gpt-oss, GGUF `gpt-4o`) also cuts words where the case changes up: "aB" is two
/// pre-tokens, so the merge "a B" cannot join them, where GPT-2's split keeps it one.
#[test]
fn o200k_cuts_words_at_upper_case() {
    for (pre, expected) in [("gpt2", &["aB"][..]), ("gpt-4o", &["a", "B"][..])] {
        let mut spec = tiny_gpt2_spec(pre);
        spec.tokens.insert(256, "aB".into());
        spec.token_types.insert(256, 1);
        spec.eos_token_id = Some(260);
        spec.merges.push("a B".into());
        let tok = Tokenizer::from_gguf_spec(&spec).unwrap();
        let ids = tok.encode("aB", false).unwrap();
        assert_eq!(ids, ids_of(&tok, expected), "pre {pre}");
    }
}

#[test]
fn gpt2_pre_tokenizer_follows_gguf_pre() {
    let cases: &[(&str, &[&str])] = &[
        // One pre-token "1234": merges apply in rank order.
        ("gpt2", &["12", "34"]),
        ("smollm", &["12", "34"]),
        ("something-new", &["12", "34"]),
        // Llama 3 cuts numbers into groups of three digits first.
        ("llama-bpe", &["123", "4"]),
        // Qwen2 cuts every digit.
        ("qwen2", &["1", "2", "3", "4"]),
        // gpt-oss's o200k, as Llama 3.
        ("gpt-4o", &["123", "4"]),
    ];
    for (pre, expected) in cases {
        let tok = Tokenizer::from_gguf_spec(&tiny_gpt2_spec(pre)).unwrap();
        assert!(!tok.add_bos(), "{pre}");
        let ids = tok.encode("1234<|end|>", false).unwrap();
        let mut want = ids_of(&tok, expected);
        want.push(259);
        assert_eq!(ids, want, "pre {pre}");
        assert_eq!(tok.decode(&ids, false).unwrap(), "1234<|end|>");
        assert_eq!(tok.decode(&ids, true).unwrap(), "1234");
        let text = "héllo wörld\n\t😀";
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "pre {pre}");
    }
}

/// A 256-token Gemma 4 vocabulary: four specials, printable ASCII, `▁`, a newline, and 156
/// two-letter merges ("aa", "ab", …).
fn tiny_gemma4_spec() -> GgufTokenizerSpec {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    tokens.extend((33u8..127).map(|c| (c as char).to_string()));
    tokens.extend(["\u{2581}", "\n"].map(String::from));
    let mut merges = Vec::new();
    let letters = ('a'..='z').collect::<Vec<_>>();
    'outer: for &a in &letters {
        for &b in &letters {
            if tokens.len() == 256 {
                break 'outer;
            }
            merges.push(format!("{a} {b}"));
            tokens.push(format!("{a}{b}"));
        }
    }
    let mut token_types = vec![1; tokens.len()];
    token_types[..4].fill(3);
    GgufTokenizerSpec {
        model: "gemma4".into(),
        tokens,
        token_types,
        merges,
        bos_token_id: Some(2),
        eos_token_id: Some(1),
        unk_token_id: Some(3),
        pad_token_id: Some(0),
        add_bos: Some(false),
        ..Default::default()
    }
}

/// Gemma 4's GGUF tokenizer gives llama.cpp b11434's ids (its `/tokenize` on a file with
/// this vocabulary, written by its converter, 2026-12-07): spaces as `▁` with none put in
/// front, newlines cut out, merges over raw characters; BOS added even where the file says
/// not (as llama.cpp overrides it); decoding gives the text back.
#[test]
fn gemma4_tokenizes_as_llama_cpp() {
    let tok = Tokenizer::from_gguf_spec(&tiny_gemma4_spec()).unwrap();
    let cases: [(&str, &[u32]); 7] = [
        ("hello world", &[75, 215, 79, 82, 98, 90, 82, 85, 79, 71]),
        ("ab cd\n\nef", &[101, 98, 155, 99, 99, 209]),
        (
            " leading space",
            &[98, 79, 72, 103, 76, 81, 74, 98, 86, 83, 102, 72],
        ),
        ("trailing  ", &[87, 85, 108, 79, 76, 81, 74, 98, 98]),
        ("x\ny\n\n\nz", &[91, 99, 92, 99, 99, 99, 93]),
        ("Hi, there!", &[43, 76, 15, 98, 87, 75, 221, 72, 4]),
        ("abcabc", &[101, 70, 101, 70]),
    ];
    for (text, want) in cases {
        assert_eq!(tok.encode(text, false).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(want, false).unwrap(), text, "{text:?}");
    }
    assert_eq!(tok.encode("ab", true).unwrap(), [2, 101]);
}

/// Gemma 4's markers are control tokens: a template's text encodes to them, they decode back
/// when special tokens are kept (as the `gemma4` parsers ask), and the model's turn ends at
/// `<turn|>` or `<|tool_response>` as well as `<eos>`, as llama.cpp decides for this
/// vocabulary.
#[test]
fn gemma4_markers_are_special_and_end_the_turn() {
    let mut spec = tiny_gemma4_spec();
    let markers = [
        "<|turn>",
        "<turn|>",
        "<|channel>",
        "<channel|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        "<|\"|>",
    ];
    let first = spec.tokens.len() as u32;
    spec.tokens.extend(markers.map(String::from));
    spec.token_types.extend([3; 8]);
    let tok = Tokenizer::from_gguf_spec(&spec).unwrap();
    assert_eq!(tok.eos_token_ids(), [1, first + 1, first + 6]);
    let text = "<|channel>thought\n<channel|><|tool_call>call:f{q:<|\"|>ab<|\"|>}<tool_call|>";
    let ids = tok.encode(text, false).unwrap();
    for (i, m) in markers.iter().enumerate().skip(2) {
        if text.contains(m) {
            assert!(
                ids.contains(&(first + i as u32)),
                "{m} not one token: {ids:?}"
            );
        }
    }
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(tok.decode(&ids, true).unwrap(), "thought\ncall:f{q:ab}");
}
