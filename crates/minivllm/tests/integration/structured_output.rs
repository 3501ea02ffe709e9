//! Structured output end to end on the test model: every completion under a regex, a
//! choice or a JSON schema is one the constraint accepts (checked here independently of
//! llguidance), greedy constrained output is the same alone and batched, and constraints
//! that do not compile are refused with their reason.

use minivllm::entrypoints::llm::LLM;
use minivllm::outputs::RequestOutput;
use minivllm::sampling_params::{SamplingParams, StructuredOutputsParams};
use serde_json::{json, Value};

use crate::common;

fn llm() -> LLM {
    common::test_llm(512, 64 << 20)
}

fn params(so: StructuredOutputsParams, temperature: f32, n: usize) -> SamplingParams {
    SamplingParams {
        temperature,
        n,
        seed: Some(7),
        max_tokens: Some(120),
        structured_outputs: Some(so),
        ..SamplingParams::default()
    }
}

fn texts(outs: &[RequestOutput]) -> Vec<String> {
    outs.iter()
        .flat_map(|o| o.outputs.iter().map(|c| c.text.clone()))
        .collect()
}

const PROMPTS: [&str; 3] = [
    "Give me a date:",
    "Describe a person as JSON:",
    "Is the sky blue? Answer:",
];

#[test]
fn regex_choice_and_schema_outputs_follow_their_constraints() {
    let mut llm = llm();
    let prompts: Vec<String> = PROMPTS.iter().map(|p| p.to_string()).collect();

    let rx = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]";
    let whole = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    let outs = llm
        .generate(
            prompts.clone(),
            &params(StructuredOutputsParams::regex(rx), 1.0, 3),
            false,
        )
        .unwrap();
    for text in texts(&outs) {
        assert!(whole.is_match(&text), "{text:?} does not match {rx}");
    }

    let choices = vec![
        "yes".to_string(),
        "no".to_string(),
        "it depends".to_string(),
    ];
    let outs = llm
        .generate(
            prompts.clone(),
            &params(StructuredOutputsParams::choice(choices.clone()), 1.0, 3),
            false,
        )
        .unwrap();
    for text in texts(&outs) {
        assert!(choices.contains(&text), "{text:?} is not a choice");
    }

    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}
        },
        "required": ["name", "age", "pets"],
        "additionalProperties": false
    });
    let outs = llm
        .generate(
            prompts,
            &params(StructuredOutputsParams::json_schema(schema), 0.7, 2),
            false,
        )
        .unwrap();
    for text in texts(&outs) {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let o = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {text}"));
        assert_eq!(o.len(), 3, "{text}");
        assert!(
            o["name"].as_str().is_some_and(|s| s.chars().count() <= 12),
            "{text}"
        );
        assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
        let pets = o["pets"].as_array().unwrap();
        assert!(
            pets.len() <= 2 && pets.iter().all(|p| p == "cat" || p == "dog"),
            "{text}"
        );
    }
}

#[test]
fn greedy_constrained_output_is_the_same_alone_and_batched() {
    let mut llm = llm();
    let so = StructuredOutputsParams::json_schema(json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 20}},
        "required": ["answer"],
        "additionalProperties": false
    }));
    let p = params(so, 0.0, 1);
    let prompts: Vec<String> = PROMPTS.iter().map(|p| p.to_string()).collect();
    let alone: Vec<String> = prompts
        .iter()
        .flat_map(|q| texts(&llm.generate([q.clone()], &p, false).unwrap()))
        .collect();
    let batched = texts(&llm.generate(prompts, &p, false).unwrap());
    assert_eq!(alone, batched);
    for text in &alone {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v["answer"].is_string(), "{text}");
    }
}

#[test]
fn constraints_that_do_not_compile_are_refused_with_their_reason() {
    let mut llm = llm();
    let refused = |llm: &mut LLM, so: StructuredOutputsParams| {
        let e = llm
            .generate(["Hi".to_string()], &params(so, 0.0, 1), false)
            .unwrap_err();
        e.to_string()
    };
    let e = refused(&mut llm, StructuredOutputsParams::regex("(unclosed"));
    assert!(e.contains("invalid regex"), "{e}");
    let e = refused(
        &mut llm,
        StructuredOutputsParams::json_schema(json!({"type": "no such type"})),
    );
    assert!(e.contains("invalid JSON schema"), "{e}");
    let e = refused(
        &mut llm,
        StructuredOutputsParams::grammar("start: undefined_rule"),
    );
    assert!(e.contains("invalid grammar"), "{e}");
    let e = refused(&mut llm, StructuredOutputsParams::choice(Vec::new()));
    assert!(e.contains("at least one"), "{e}");
    // The engine goes on serving.
    let ok = llm
        .generate(
            ["Hi".to_string()],
            &params(StructuredOutputsParams::regex("ok"), 0.0, 1),
            false,
        )
        .unwrap();
    assert_eq!(texts(&ok), ["ok"]);
}

#[test]
fn a_complete_constraint_ends_the_completion_whatever_bans_eos() {
    let mut llm = llm();
    let choices = vec!["yes".to_string(), "no".to_string()];
    for (min_tokens, ignore_eos) in [(8, false), (0, true)] {
        let p = SamplingParams {
            min_tokens,
            ignore_eos,
            ..params(StructuredOutputsParams::choice(choices.clone()), 1.0, 3)
        };
        let outs = llm
            .generate(["Is it raining?".to_string()], &p, false)
            .unwrap();
        for c in &outs[0].outputs {
            assert!(
                choices.contains(&c.text),
                "{:?} ({min_tokens}, {ignore_eos})",
                c.text
            );
            assert_eq!(
                c.finish_reason,
                Some(minivllm::sequence::FinishReason::Stop)
            );
        }
    }
    // JSON without free whitespace (vLLM's disable_any_whitespace).
    let so = StructuredOutputsParams {
        disable_any_whitespace: true,
        ..StructuredOutputsParams::json_schema(json!({
            "type": "object", "properties": {"n": {"type": "integer"}},
            "required": ["n"], "additionalProperties": false
        }))
    };
    let outs = llm
        .generate(
            ["A number as JSON:".to_string()],
            &params(so, 0.0, 1),
            false,
        )
        .unwrap();
    let text = &outs[0].outputs[0].text;
    assert!(
        text.starts_with("{\"n\":") && !text.contains(char::is_whitespace),
        "{text:?}"
    );
}

/// With a reasoning parser the constraint waits for `</think>`: any text before it, only the
/// constrained answer after (SmolLM2's vocabulary; `</think>` is several tokens in it).
#[test]
fn a_constraint_after_reasoning_waits_for_the_thinking_to_end() {
    use minivllm::reasoning::{PromptThinking, ReasoningParser, ReasoningParserName};
    use minivllm::structured_output::backend_guidance::GuidanceBackend;

    let llm = llm();
    let tok = llm.engine().tokenizer();
    let vocab_size = llm.engine().model().config().vocab_size;
    let backend = GuidanceBackend::new(tok.vocabulary().unwrap(), vocab_size).unwrap();
    let digits = StructuredOutputsParams::regex("[0-9]{2}");
    let one = |text: &str| {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(ids.len(), 1, "{text:?} is one token");
        ids[0]
    };
    let (word, digit) = (one("Let"), one("4"));
    for (name, prompt, thought) in [
        (
            ReasoningParserName::DeepSeekR1,
            PromptThinking::Open,
            "Let me add 2 and 2.</think>",
        ),
        (
            ReasoningParserName::Qwen3,
            PromptThinking::Absent,
            "<think>Let me add.</think>",
        ),
    ] {
        let before = ReasoningParser::new(name).grammar_prefix(prompt);
        let mut g = backend.compile_after(&digits, before).unwrap();
        for id in tok.encode(thought, false).unwrap() {
            assert!(g.token_mask().is_allowed(id), "{name:?}: thinking is free");
            g.accept_token(id);
        }
        let mask = g.token_mask();
        assert!(
            mask.is_allowed(digit) && !mask.is_allowed(word),
            "{name:?}: then the constraint"
        );
        for id in tok.encode("42", false).unwrap() {
            g.accept_token(id);
        }
        assert!(g.is_terminated() || g.token_mask().is_allowed(tok.eos_token_id().unwrap()));
    }
    // Thinking turned off in the prompt: the constraint from the first token.
    let off =
        ReasoningParser::new(ReasoningParserName::Qwen3).grammar_prefix(PromptThinking::Closed);
    let mut g = backend.compile_after(&digits, off).unwrap();
    assert!(!g.token_mask().is_allowed(word));
    // Qwen3 with the prompt leaving it to the reply: it may answer at once.
    let maybe =
        ReasoningParser::new(ReasoningParserName::Qwen3).grammar_prefix(PromptThinking::Absent);
    let mut g = backend.compile_after(&digits, maybe).unwrap();
    let mask = g.token_mask();
    assert!(mask.is_allowed(digit) && !mask.is_allowed(word));
}

/// A vocabulary of whole `words` and `specials` (special tokens), its EOS the specials named
/// in `eos`, and the id of each token by its text.
fn word_vocab(
    words: &'static [&'static str],
    specials: &'static [&'static str],
    eos: &[&str],
) -> (
    minivllm::structured_output::vocabulary::Vocabulary,
    impl Fn(&str) -> u32 + Copy,
) {
    use minivllm::structured_output::vocabulary::{VocabToken, Vocabulary};
    use std::sync::Arc;

    let tokens: Vec<VocabToken> = (words.iter())
        .map(|w| VocabToken::Text(w.as_bytes().to_vec()))
        .chain(specials.iter().map(|s| VocabToken::Special(s.to_string())))
        .collect();
    let id = move |t: &str| -> u32 {
        let at = (words.iter().chain(specials.iter())).position(|w| *w == t);
        at.unwrap_or_else(|| panic!("{t:?} is no token")) as u32
    };
    let vocab = Vocabulary {
        tokens,
        eos_token_ids: eos.iter().map(|t| id(t)).collect(),
        // Longest word first (the grammar engine tokenizes the text it forces).
        tokenize: Arc::new(move |mut text: &str| {
            let mut ids = Vec::new();
            while let Some(w) = (words.iter())
                .filter(|w| text.starts_with(**w))
                .max_by_key(|w| w.len())
            {
                ids.push(id(w));
                text = &text[w.len()..];
            }
            ids
        }),
    };
    (vocab, id)
}

/// With `openai_gptoss` the constraint covers gpt-oss's `final` channel: whole `analysis`
/// and `commentary` messages before it are free, their markers special tokens; a tool call
/// or an early `<|return|>` is refused (a harmony-like vocabulary of whole words and markers).
#[test]
fn a_constraint_with_harmony_covers_only_the_final_channel() {
    use minivllm::reasoning::{PromptThinking, ReasoningParser, ReasoningParserName};
    use minivllm::structured_output::backend_guidance::GuidanceBackend;

    const SPECIALS: &[&str] = &[
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|constrain|>",
    ];
    const WORDS: &[&str] = &[
        "analysis",
        "commentary",
        "final",
        "assistant",
        "Think",
        " hard",
        "\n",
        "4",
        "2",
        "x",
    ];
    let (vocab, id) = word_vocab(WORDS, SPECIALS, &["<|return|>", "<|call|>"]);
    let backend = GuidanceBackend::new(vocab, 20).unwrap();
    let before = ReasoningParser::new(ReasoningParserName::OpenAiGptOss)
        .grammar_prefix(PromptThinking::Absent);
    let digits = StructuredOutputsParams::regex("[0-9]{2}");
    let thought = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Think",
        " hard",
        "\n",
        "4",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary",
        "<|message|>",
        "x",
        "<|end|>",
        "<|start|>",
        "assistant",
    ];
    for reply in [&thought[..], &[]] {
        let mut g = backend.compile_after(&digits, before).unwrap();
        for (n, t) in reply
            .iter()
            .chain(&["<|channel|>", "final", "<|message|>"])
            .enumerate()
        {
            let mask = g.token_mask();
            assert!(
                mask.is_allowed(id(t)),
                "{t:?} (token {n}) refused in {reply:?}"
            );
            if *t == " hard" {
                // Inside a message: any text, its end; no tool call, no end of the reply.
                assert!(mask.is_allowed(id("x")) && mask.is_allowed(id("<|end|>")));
                assert!(!mask.is_allowed(id("<|call|>")) && !mask.is_allowed(id("<|return|>")));
            }
            g.accept_token(id(t));
        }
        let mask = g.token_mask();
        assert!(mask.is_allowed(id("4")), "the constraint after the header");
        for refused in [
            "Think",
            "x",
            "<|end|>",
            "<|return|>",
            "<|call|>",
            "<|channel|>",
        ] {
            assert!(
                !mask.is_allowed(id(refused)),
                "{refused:?} allowed in the answer"
            );
        }
        g.accept_token(id("4"));
        g.accept_token(id("2"));
        let mask = g.token_mask();
        assert!(g.is_terminated() || mask.is_allowed(id("<|return|>")));
        assert!(!mask.is_allowed(id("2")), "the answer is complete");
    }
}

/// With `gemma4` the constraint follows Gemma 4's channel block when the reply may think
/// (the block optional; only its closer ends it, a special token), or starts at once when the
/// prompt closed it (thinking off), or after the block's rest when the prompt left it open.
#[test]
fn a_constraint_with_gemma4_follows_its_channel_block() {
    use minivllm::reasoning::{PromptThinking, ReasoningParser, ReasoningParserName};
    use minivllm::structured_output::backend_guidance::GuidanceBackend;

    const SPECIALS: &[&str] = &["<|channel>", "<channel|>", "<turn|>", "<|tool_call>"];
    const WORDS: &[&str] = &["thought", "\n", "Hmm", " ok", "4", "2", "x"];
    let (vocab, id) = word_vocab(WORDS, SPECIALS, &["<turn|>"]);
    let backend = GuidanceBackend::new(vocab, 20).unwrap();
    let gemma4 = ReasoningParser::new(ReasoningParserName::Gemma4);
    assert_eq!(gemma4.grammar_prefix(PromptThinking::Closed), None);
    let digits = StructuredOutputsParams::regex("[0-9]{2}");
    let block = ["<|channel>", "thought", "\n", "Hmm", " ok", "<channel|>"];
    let cases: [(PromptThinking, &[&str]); 3] = [
        (PromptThinking::Absent, &block),
        (PromptThinking::Absent, &[]),
        (PromptThinking::Open, &block[1..]),
    ];
    for (prompt, reply) in cases {
        let before = gemma4.grammar_prefix(prompt);
        let mut g = backend.compile_after(&digits, before).unwrap();
        for (n, t) in reply.iter().enumerate() {
            let mask = g.token_mask();
            assert!(
                mask.is_allowed(id(t)),
                "{t:?} (token {n}) refused in {reply:?}"
            );
            if *t == " ok" {
                // Inside the block: any text or its closer; no call, no end of the reply.
                assert!(mask.is_allowed(id("x")) && mask.is_allowed(id("<channel|>")));
                assert!(!mask.is_allowed(id("<turn|>")) && !mask.is_allowed(id("<|tool_call>")));
            }
            g.accept_token(id(t));
        }
        let mask = g.token_mask();
        assert!(mask.is_allowed(id("4")), "the constraint after {reply:?}");
        for refused in ["Hmm", "x", "<channel|>", "<turn|>"] {
            assert!(
                !mask.is_allowed(id(refused)),
                "{refused:?} allowed in the answer"
            );
        }
        g.accept_token(id("4"));
        g.accept_token(id("2"));
        assert!(g.is_terminated() || g.token_mask().is_allowed(id("<turn|>")));
    }
}

/// vLLM's `structural_tag`: free text, and after a trigger only a structure (its begin, JSON
/// of its schema, its end), then free text again (SmolLM2's vocabulary).
#[test]
fn a_structural_tag_constrains_only_after_its_trigger() {
    use minivllm::structured_output::backend_guidance::GuidanceBackend;
    use minivllm::structured_output::StructuredOutputGrammar;

    let llm = llm();
    let tok = llm.engine().tokenizer();
    let vocab_size = llm.engine().model().config().vocab_size;
    let backend = GuidanceBackend::new(tok.vocabulary().unwrap(), vocab_size).unwrap();
    let tag = json!({"type": "structural_tag", "triggers": ["<function="], "structures": [
        {"begin": "<function=get_weather>", "end": "</function>", "schema": {"type": "object",
         "properties": {"city": {"type": "string"}}, "required": ["city"],
         "additionalProperties": false}}]});
    let params = StructuredOutputsParams {
        structural_tag: Some(Value::String(tag.to_string())),
        ..Default::default()
    };
    let mut g = backend.compile(&params).unwrap();
    let eos = tok.eos_token_id().unwrap();
    let first = |text: &str| tok.encode(text, false).unwrap()[0];
    let feed = |g: &mut Box<dyn StructuredOutputGrammar>, text: &str| {
        for id in tok.encode(text, false).unwrap() {
            assert!(
                g.token_mask().is_allowed(id),
                "{text:?}: token {id} refused"
            );
            g.accept_token(id);
        }
    };
    assert!(g.token_mask().is_allowed(first("Hello")) && g.token_mask().is_allowed(eos));
    feed(&mut g, "Hello there. I will call it: <function=");
    assert!(
        !g.token_mask().is_allowed(first("foo")),
        "only a structure's name"
    );
    feed(&mut g, "get_weather>");
    assert!(!g.token_mask().is_allowed(first("Hello")), "only its JSON");
    feed(&mut g, "{\"city\": \"Paris\"}</function>");
    assert!(
        g.token_mask().is_allowed(eos),
        "the reply may end after a structure"
    );
    assert!(g.token_mask().is_allowed(first(" Done")), "free text again");
    feed(&mut g, " Done.");
    assert!(g.token_mask().is_allowed(eos));
}

/// JSON's free whitespace is bounded: pretty-printed JSON passes, but a gap between two
/// tokens takes at most one line break and 40 characters of indentation, so a model
/// sampling blank lines cannot run an object on until `max_tokens` (seen at temperature 1
/// on SmolLM2 with the default whitespace).
#[test]
fn json_whitespace_is_bounded_between_tokens() {
    use minivllm::structured_output::backend_guidance::GuidanceBackend;

    let llm = llm();
    let tok = llm.engine().tokenizer();
    let vocab_size = llm.engine().model().config().vocab_size;
    let backend = GuidanceBackend::new(tok.vocabulary().unwrap(), vocab_size).unwrap();
    let schema = json!({"type": "object", "properties": {"kind": {"const": "point"},
        "xs": {"type": "array", "items": {"type": "integer"}}}, "required": ["kind", "xs"]});
    // Whether `text` is a prefix the grammar allows, byte by byte of its tokens.
    let allows = |text: &str| {
        let mut g = backend
            .compile(&StructuredOutputsParams::json_schema(schema.clone()))
            .unwrap();
        tok.encode(text, false).unwrap().into_iter().all(|id| {
            let ok = g.token_mask().is_allowed(id);
            if ok {
                g.accept_token(id);
            }
            ok
        })
    };
    let pretty = serde_json::to_string_pretty(&json!({"kind": "point", "xs": [1, 2]})).unwrap();
    assert!(allows(&pretty), "{pretty}");
    assert!(allows("{\"kind\": \"point\",\n\t\t\"xs\": [1, 2]}"));
    assert!(allows(&format!(
        "{{\"kind\": \"point\"\n{}",
        " ".repeat(40)
    )));
    assert!(!allows(&format!(
        "{{\"kind\": \"point\"\n{}",
        " ".repeat(41)
    )));
    assert!(!allows("{\"kind\": \"point\"\n\n"));
    assert!(!allows("{\"kind\":   \"point\"}"));
    // Without whitespace at all (vLLM's disable_any_whitespace) nothing is allowed.
    let mut compact = StructuredOutputsParams::json_schema(schema.clone());
    compact.disable_any_whitespace = true;
    let mut g = backend.compile(&compact).unwrap();
    for id in tok.encode("{\"kind\":", false).unwrap() {
        g.accept_token(id);
    }
    assert!(!g
        .token_mask()
        .is_allowed(tok.encode(" ", false).unwrap()[0]));
}
