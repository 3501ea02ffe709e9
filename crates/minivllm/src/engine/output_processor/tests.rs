//! The output processor against the scheduler's records it reads: a sibling that finished
//! earlier still shows in its request's outputs, and a stop string ends the output at its
//! token even when the scheduler appended more in the same step (verified drafts).

use std::sync::OnceLock;

use super::*;
use crate::model_executor::layers::sampler::SampledToken;

fn tok() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    let dir = crate::testing::reference_dir().join("smollm2-hf");
    Arc::clone(TOKENIZER.get_or_init(|| Arc::new(Tokenizer::from_hf_dir(&dir).unwrap())))
}

fn encode(text: &str) -> Vec<TokenId> {
    tok().encode(text, false).unwrap()
}

/// A request of `n` sequences (ids 1..=n) on `prompt`, added to `op` and to the scheduler's
/// records `seqs`.
fn add(op: &mut OutputProcessor, seqs: &mut Sequences, prompt: &[TokenId], params: SamplingParams) {
    let request = RequestId("r".into());
    let ids: Vec<SeqId> = (1..=params.n as u64).map(SeqId).collect();
    let stop = StopStrings::new(&params.stop);
    let params = Arc::new(params);
    for (index, &id) in ids.iter().enumerate() {
        let seq = Sequence::new(id, prompt.to_vec(), 0, 0).of_request(request.clone(), index);
        seqs.insert(id, seq);
    }
    let prompt = ProcessedPrompt {
        text: None,
        token_ids: prompt.to_vec(),
    };
    op.add_request(request, prompt, params, stop, &ids, Arrival::now());
}

/// The scheduler's part of a step for `seq`: `token` appended, its output.
fn sampled(
    seqs: &mut Sequences,
    seq: u64,
    token: TokenId,
    finish: Option<FinishReason>,
) -> EngineCoreOutput {
    seqs.get_mut(&SeqId(seq)).unwrap().token_ids.push(token);
    EngineCoreOutput {
        seq: SeqId(seq),
        new_token: Some(SampledToken {
            token_id: token,
            logprob: -0.5,
            top_logprobs: Vec::new(),
            rank: None,
        }),
        prompt_logprobs: None,
        finish: finish.map(|f| (f, None)),
        stop_token: false,
        pooled: None,
        num_cached_tokens: 0,
    }
}

#[test]
fn a_sibling_finished_earlier_still_shows_its_tokens() {
    let (mut op, mut seqs) = (OutputProcessor::new(tok()), Sequences::new());
    let params = SamplingParams {
        n: 2,
        ..SamplingParams::default()
    };
    let prompt = encode("The capital of France is");
    let [a, b, c] = [encode(" Paris")[0], encode(" Lyon")[0], encode(" Nice")[0]];
    add(&mut op, &mut seqs, &prompt, params);
    let step = vec![
        sampled(&mut seqs, 1, a, None),
        sampled(&mut seqs, 2, b, None),
    ];
    op.process_outputs(step, &seqs).unwrap();
    let step = vec![
        sampled(&mut seqs, 1, c, Some(FinishReason::Length)),
        sampled(&mut seqs, 2, c, None),
    ];
    let out = op.process_outputs(step, &seqs).unwrap();
    assert!(out.stopped.is_empty());
    // The engine finishes sequence 1 in the scheduler, whose record passes here.
    let first = seqs.remove(&SeqId(1)).unwrap();
    op.retire(first);
    let step = vec![sampled(&mut seqs, 2, a, Some(FinishReason::Length))];
    let out = op.process_outputs(step, &seqs).unwrap();
    let r = &out.request_outputs[0];
    assert!(r.finished);
    let ids: Vec<&[TokenId]> = r.outputs.iter().map(|o| &o.token_ids[..]).collect();
    assert_eq!(ids, [&[a, c][..], &[b, c, a][..]]);
    assert_eq!(r.outputs[0].text, " Paris Nice");
    assert!(op.is_empty());
}

#[test]
fn a_stop_string_ends_the_output_at_its_token() {
    let (mut op, mut seqs) = (OutputProcessor::new(tok()), Sequences::new());
    let params = SamplingParams {
        stop: vec!["Paris".into()],
        ..SamplingParams::default()
    };
    let prompt = encode("The capital of France is");
    let [paris, is] = [encode(" Paris")[0], encode(" is")[0]];
    add(&mut op, &mut seqs, &prompt, params);
    // Two tokens in one step, as accepted drafts come: the first completes the stop string.
    let step = vec![
        sampled(&mut seqs, 1, paris, None),
        sampled(&mut seqs, 1, is, None),
    ];
    let out = op.process_outputs(step, &seqs).unwrap();
    assert_eq!(out.stopped, [SeqId(1)]);
    let o = &out.request_outputs[0].outputs[0];
    assert_eq!(o.token_ids, [paris]);
    assert_eq!(
        (o.text.as_str(), o.finish_reason),
        (" ", Some(FinishReason::Stop))
    );
}
