//! The step's seams for structured output and speculative decoding, on the test model: a
//! grammar's mask decides what a sequence samples, and draft tokens, whether guessed right
//! or wrong, leave plain decoding's tokens unchanged (and right guesses take fewer steps).

use std::collections::HashMap;

use crate::common;

use minivllm::engine::llm_engine::{LLMEngine, PromptInput};
use minivllm::entrypoints::llm::LLM;
use minivllm::ids::{SeqId, TokenId};
use minivllm::outputs::RequestOutput;
use minivllm::sampling_params::SamplingParams;
use minivllm::sequence::FinishReason;
use minivllm::structured_output::{StructuredOutputGrammar, TokenBitmask};
use minivllm::worker::draft_proposer::DraftProposer;

const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "List three fruits:",
];

fn llm() -> LLM {
    common::test_llm(256, 64 << 20)
}

/// Runs every request to the end; the final outputs by request id, and the steps it took.
fn run(engine: &mut LLMEngine) -> (HashMap<String, RequestOutput>, u64) {
    let steps = engine.stats().num_steps;
    let mut done = HashMap::new();
    while engine.has_unfinished_requests() {
        for o in engine.step().expect("step") {
            if o.finished {
                done.insert(o.request_id.clone(), o);
            }
        }
    }
    (done, engine.stats().num_steps - steps)
}

fn add_all(engine: &mut LLMEngine, params: &SamplingParams) {
    for (i, p) in PROMPTS.iter().enumerate() {
        let prompt = PromptInput::Text(p.to_string());
        engine
            .add_request(format!("r{i}"), prompt, params.clone(), 0)
            .unwrap();
    }
}

fn completions(outs: &HashMap<String, RequestOutput>) -> Vec<Vec<Vec<TokenId>>> {
    (0..PROMPTS.len())
        .map(|i| {
            let o = &outs[&format!("r{i}")];
            o.outputs.iter().map(|c| c.token_ids.clone()).collect()
        })
        .collect()
}

/// Accepts exactly `tokens`, then only EOS.
#[derive(Debug, Clone)]
struct Forced {
    tokens: Vec<TokenId>,
    next: usize,
    eos: TokenId,
    vocab: usize,
}

impl StructuredOutputGrammar for Forced {
    fn token_mask(&mut self) -> TokenBitmask {
        let mut mask = TokenBitmask::new(self.vocab);
        mask.allow(*self.tokens.get(self.next).unwrap_or(&self.eos));
        mask
    }

    fn accept_token(&mut self, token: TokenId) {
        let allowed = *self.tokens.get(self.next).unwrap_or(&self.eos);
        assert_eq!(token, allowed, "a token the mask banned");
        self.next += 1;
    }

    fn box_clone(&self) -> Box<dyn StructuredOutputGrammar> {
        Box::new(self.clone())
    }
}

/// Allows anything for `ok` tokens, then breaks (as a grammar over its limits does): only
/// EOS, and an error to report.
#[derive(Debug, Clone)]
struct Breaks {
    ok: usize,
    seen: usize,
    eos: TokenId,
    vocab: usize,
}

impl StructuredOutputGrammar for Breaks {
    fn token_mask(&mut self) -> TokenBitmask {
        let mut mask = TokenBitmask::new(self.vocab);
        if self.seen < self.ok {
            (0..self.vocab as TokenId).for_each(|t| mask.allow(t));
        } else {
            mask.allow(self.eos);
        }
        mask
    }

    fn accept_token(&mut self, _: TokenId) {
        self.seen += 1;
    }

    fn error(&self) -> Option<String> {
        (self.seen > self.ok).then(|| "over its limits".to_string())
    }

    fn box_clone(&self) -> Box<dyn StructuredOutputGrammar> {
        Box::new(self.clone())
    }
}

#[test]
fn a_grammar_that_breaks_ends_its_sequence_with_an_error_and_no_other() {
    let mut llm = llm();
    let engine = llm.engine_mut();
    let tok = engine.tokenizer().clone();
    let free = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(12),
        ..SamplingParams::default()
    };
    engine
        .add_request(
            "alone",
            PromptInput::Text(PROMPTS[1].into()),
            free.clone(),
            0,
        )
        .unwrap();
    let (alone, _) = run(engine);
    let grammar = Breaks {
        ok: 3,
        seen: 0,
        eos: tok.eos_token_ids()[0],
        vocab: engine.model().config().vocab_size,
    };
    let greedy = SamplingParams {
        ignore_eos: true,
        ..free.clone()
    };
    let prompt = PromptInput::Text(PROMPTS[0].into());
    let checks = engine.request_checks().clone();
    engine
        .add_checked_request(
            "broken",
            prompt,
            checks.check(greedy, 0).unwrap(),
            Some(Box::new(grammar)),
        )
        .unwrap();
    engine
        .add_request("free", PromptInput::Text(PROMPTS[1].into()), free, 0)
        .unwrap();
    let (outs, _) = run(engine);
    let broken = &outs["broken"].outputs[0];
    assert_eq!(broken.finish_reason, Some(FinishReason::Error));
    // Three tokens, then the EOS the broken grammar forced, which is not text.
    assert_eq!(broken.token_ids.len(), 4);
    assert_eq!(
        broken.text,
        tok.decode(&broken.token_ids[..3], true).unwrap()
    );
    assert_eq!(
        outs["free"].outputs[0].token_ids,
        alone["alone"].outputs[0].token_ids
    );
}

#[test]
fn a_grammar_mask_decides_what_its_sequences_sample_and_no_other() {
    let mut llm = llm();
    let engine = llm.engine_mut();
    let tok = engine.tokenizer().clone();
    let forced = tok.encode(" Lyon, of course.", false).unwrap();
    let grammar = Forced {
        tokens: forced.clone(),
        next: 0,
        eos: tok.eos_token_ids()[0],
        vocab: engine.model().config().vocab_size,
    };
    let free = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(12),
        ..SamplingParams::default()
    };
    engine
        .add_request(
            "alone",
            PromptInput::Text(PROMPTS[0].into()),
            free.clone(),
            0,
        )
        .unwrap();
    let (alone, _) = run(engine);

    // Two sampled completions under the grammar, beside an unconstrained request.
    let constrained = SamplingParams {
        temperature: 1.0,
        seed: Some(3),
        n: 2,
        max_tokens: Some(30),
        logprobs: Some(1),
        ..SamplingParams::default()
    };
    let prompt = PromptInput::Text(PROMPTS[0].into());
    let checks = engine.request_checks().clone();
    engine
        .add_checked_request(
            "forced",
            prompt,
            checks.check(constrained, 0).unwrap(),
            Some(Box::new(grammar)),
        )
        .unwrap();
    engine
        .add_request("free", PromptInput::Text(PROMPTS[0].into()), free, 0)
        .unwrap();
    let (outs, _) = run(engine);
    for c in &outs["forced"].outputs {
        let n = forced.len();
        assert_eq!(c.token_ids[..n], forced[..], "completion {}", c.index);
        // The grammar ends with EOS, which stops the sequence.
        assert!(c.token_ids.len() <= n + 1);
        assert_eq!(c.finish_reason, Some(FinishReason::Stop));
        assert_eq!(c.text, " Lyon, of course.");
        // The only allowed token takes all the probability of the masked logits.
        for lp in c.logprobs.as_ref().unwrap() {
            assert!(lp.entries[0].1.abs() < 1e-6, "{lp:?}");
        }
    }
    assert_eq!(
        outs["free"].outputs[0].token_ids,
        alone["alone"].outputs[0].token_ids
    );
}

/// Proposes the next `k` tokens of the sequence's known continuation: the token ids plain
/// decoding gave, keyed by their prompt and sibling.
pub(crate) struct Oracle {
    pub runs: Vec<Vec<TokenId>>,
    pub k: usize,
}

impl DraftProposer for Oracle {
    fn propose(&mut self, _: SeqId, token_ids: &[TokenId], max_len: usize) -> Vec<TokenId> {
        (self.runs.iter())
            .find(|r| r.len() > token_ids.len() && r.starts_with(token_ids))
            .map(|r| r[token_ids.len()..].iter().take(max_len).copied().collect())
            .unwrap_or_default()
    }

    fn max_draft_len(&self) -> usize {
        self.k
    }
}

/// Proposes tokens that are (nearly always) wrong.
pub(crate) struct Wrong;

impl DraftProposer for Wrong {
    fn propose(&mut self, _: SeqId, token_ids: &[TokenId], max_len: usize) -> Vec<TokenId> {
        vec![token_ids[0]; max_len]
    }

    fn max_draft_len(&self) -> usize {
        3
    }
}

#[test]
fn draft_tokens_right_or_wrong_leave_plain_decoding_tokens_unchanged() {
    let greedy = common::greedy(40);
    let seeded = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(11),
        n: 2,
        max_tokens: Some(40),
        repetition_penalty: 1.2,
        ..SamplingParams::default()
    };
    for params in [greedy, seeded] {
        let mut plain = llm();
        add_all(plain.engine_mut(), &params);
        let (expected, plain_steps) = run(plain.engine_mut());
        let expected = completions(&expected);
        let tok = plain.engine().tokenizer().clone();
        let runs: Vec<Vec<TokenId>> = (PROMPTS.iter().zip(&expected))
            .flat_map(|(p, cs)| {
                let prompt = tok.encode(p, true).unwrap();
                cs.iter().map(move |c| [prompt.clone(), c.clone()].concat())
            })
            .collect();

        let mut spec = llm();
        let oracle = Oracle { runs, k: 4 };
        spec.engine_mut()
            .set_draft_proposer(Box::new(oracle), false);
        add_all(spec.engine_mut(), &params);
        let (outs, spec_steps) = run(spec.engine_mut());
        assert_eq!(completions(&outs), expected);
        assert!(
            spec_steps * 2 < plain_steps,
            "right guesses of 4 tokens: {spec_steps} steps against {plain_steps}"
        );

        let mut wrong = llm();
        wrong
            .engine_mut()
            .set_draft_proposer(Box::new(Wrong), false);
        add_all(wrong.engine_mut(), &params);
        let (outs, _) = run(wrong.engine_mut());
        assert_eq!(completions(&outs), expected);
    }
}

/// `--speculative-config` with the n-gram proposer: the same tokens as plain decoding,
/// greedy and seeded, in fewer steps where the output repeats the prompt.
#[test]
fn ngram_speculation_gives_plain_decodings_tokens_in_fewer_steps() {
    let engine_with = |spec: Option<&str>| common::test_llm_speculative(spec).unwrap();
    let prompt = "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over \
                  the lazy dog. the quick brown fox jumps over the lazy dog. the quick";
    let greedy = common::greedy(40);
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: Some(5),
        n: 2,
        max_tokens: Some(30),
        ..SamplingParams::default()
    };
    let mut plain = engine_with(None);
    let spec = r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1, "adaptive_draft_length": false}"#;
    let mut fast = engine_with(Some(spec));
    for params in [greedy, seeded] {
        let mut steps = Vec::new();
        let mut tokens = Vec::new();
        for llm in [&mut plain, &mut fast] {
            let engine = llm.engine_mut();
            engine
                .add_request("r", PromptInput::Text(prompt.into()), params.clone(), 0)
                .unwrap();
            let (outs, n) = run(engine);
            steps.push(n);
            tokens.push(
                outs["r"]
                    .outputs
                    .iter()
                    .map(|c| c.token_ids.clone())
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(tokens[0], tokens[1], "{params:?}");
        let spec = fast.engine().stats().spec_decode;
        assert!(
            spec.num_drafts > 0 && spec.num_accepted_tokens > 0,
            "{spec:?}"
        );
        if params.temperature == 0.0 {
            // Half the output repeats the prompt (then SmolLM2 goes its own way): 40 steps
            // plain, 21 with speculation on AVX2.
            assert!(
                steps[1] * 3 < steps[0] * 2,
                "steps plain {} speculative {}",
                steps[0],
                steps[1]
            );
        }
    }
    let bad = minivllm::engine::llm_engine::EngineArgs {
        model: common::test_model_path().to_str().unwrap().to_string(),
        speculative_config: Some(
            minivllm::config::SpeculativeConfig::from_json(r#"{"method": "ngram"}"#).unwrap(),
        ),
        ..Default::default()
    };
    let err = LLM::new(&bad).err().expect("refused").to_string();
    assert!(
        err.contains("num_speculative_tokens must be provided"),
        "{err}"
    );
}
