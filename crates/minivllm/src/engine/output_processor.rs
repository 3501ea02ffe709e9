//! What happens to a step's samples before callers see them: each sequence's text
//! (incremental detokenisation), logprobs and stop checks, the gathering of a request's `n`
//! (or `best_of`) sequences into one output, and `RequestOutput`s of the kind the request
//! asked for.
//!
//! The scheduler's `Sequence` owns a sequence's token ids while it runs; this module owns
//! everything else about a request, and takes the ids over when a sequence finishes.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::core::scheduler::Scheduler;
use crate::engine::detokenizer::{DetokenizerConfig, IncrementalDetokenizer};
use crate::engine::errors::EngineError;
use crate::engine::input_processor::ProcessedPrompt;
use crate::engine::tokenizer::Tokenizer;
use crate::ids::{RequestId, SeqId, TokenId};
use crate::model_executor::layers::sampler::{
    logprobs_for, SampledToken, Sampler, SamplingContext, SeqSamplingState,
};
use crate::outputs::{CompletionOutput, RequestOutput, TokenLogprobs};
use crate::sampling_params::{RequestOutputKind, SamplingParams};
use crate::sequence::{FinishReason, Sequence, StopReason};

/// Every unfinished request's state beyond its sequences' tokens.
pub struct OutputProcessor {
    tokenizer: Arc<Tokenizer>,
    max_model_len: usize,
    requests: HashMap<RequestId, RequestState>,
    next_seq_id: u64,
}

struct RequestState {
    prompt: Option<String>,
    prompt_ids: Vec<TokenId>,
    params: SamplingParams,
    max_tokens: usize,
    /// Entry `e` scores prompt token `e` (entry 0 is `None`: nothing comes before it).
    prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// By completion index: `n` (or `best_of`) sibling sequences (vLLM v1's parallel
    /// sampling: child requests of one parent), which share the prompt's K/V through the
    /// prefix cache.
    seqs: Vec<SeqState>,
}

struct SeqState {
    id: SeqId,
    detok: IncrementalDetokenizer,
    sampling: SeqSamplingState,
    cumulative_logprob: f64,
    logprobs: Vec<TokenLogprobs>,
    finish: Option<(FinishReason, Option<StopReason>)>,
    /// The output token ids, taken from the scheduler's sequence when it finishes (the
    /// scheduler then forgets it).
    finished_ids: Vec<TokenId>,
    /// How much of the sequence earlier `DELTA` outputs carried.
    sent: Sent,
}

#[derive(Default)]
struct Sent {
    tokens: usize,
    text: usize,
    finish: bool,
}

impl SeqState {
    fn new(
        id: SeqId,
        detok: IncrementalDetokenizer,
        params: &SamplingParams,
        index: usize,
    ) -> Self {
        Self {
            id,
            detok,
            sampling: SeqSamplingState::new(params.seed, index),
            cumulative_logprob: 0.0,
            logprobs: Vec::new(),
            finish: None,
            finished_ids: Vec::new(),
            sent: Sent::default(),
        }
    }

    /// Its output ids: the scheduler's while it runs, its own once finished.
    fn output_ids<'a>(&'a self, scheduler: &'a Scheduler) -> &'a [TokenId] {
        match self.finish {
            Some(_) => &self.finished_ids,
            None => scheduler.seq(self.id).map_or(&[], Sequence::output_ids),
        }
    }
}

impl OutputProcessor {
    pub fn new(tokenizer: Arc<Tokenizer>, max_model_len: usize) -> Self {
        Self {
            tokenizer,
            max_model_len,
            requests: HashMap::new(),
            next_seq_id: 0,
        }
    }

    pub fn contains(&self, id: &RequestId) -> bool {
        self.requests.contains_key(id)
    }

    /// Unfinished requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    pub fn params(&self, id: &RequestId) -> Option<&SamplingParams> {
        self.requests.get(id).map(|r| &r.params)
    }

    fn new_seq_id(&mut self) -> SeqId {
        self.next_seq_id += 1;
        SeqId(self.next_seq_id)
    }

    /// Takes a validated request and returns its sequences, for the scheduler: `n` (or
    /// `best_of`), each sampling with its own RNG stream.
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt: ProcessedPrompt,
        params: SamplingParams,
        priority: i32,
        arrival: u64,
    ) -> Vec<Sequence> {
        let width = params.best_of_or_n().max(params.n);
        let max_tokens = params
            .max_tokens
            .unwrap_or(usize::MAX)
            .min(self.max_model_len - prompt.token_ids.len());
        let cfg = DetokenizerConfig {
            skip_special_tokens: params.skip_special_tokens,
            spaces_between_special_tokens: params.spaces_between_special_tokens,
            stop: params.stop.clone(),
            include_stop_str_in_output: params.include_stop_str_in_output,
        };
        let detok = IncrementalDetokenizer::new(&self.tokenizer, &prompt.token_ids, cfg);
        let mut seqs = Vec::with_capacity(width);
        let mut states = Vec::with_capacity(width);
        for index in 0..width {
            let seq_id = self.new_seq_id();
            let mut seq = Sequence::new(seq_id, prompt.token_ids.clone(), priority, arrival)
                .of_request(id.clone());
            // Cached prefix blocks have no logits to score, so the sequence that scores the
            // prompt computes it whole; its siblings then find it in the prefix cache.
            seq.skip_prefix_cache = index == 0 && params.prompt_logprobs.is_some();
            seqs.push(seq);
            // Cloning shares the stop-string automaton instead of building one per sibling.
            states.push(SeqState::new(seq_id, detok.clone(), &params, index));
        }
        let state = RequestState {
            prompt: prompt.text,
            prompt_ids: prompt.token_ids,
            max_tokens,
            prompt_logprobs: params.prompt_logprobs.map(|_| vec![None]),
            seqs: states,
            params,
        };
        self.requests.insert(id, state);
        seqs
    }

    /// Forgets a request; returns its sequences, for the scheduler to free.
    pub fn abort_request(&mut self, id: &RequestId) -> Vec<SeqId> {
        self.requests
            .remove(id)
            .map(|r| r.seqs.iter().map(|s| s.id).collect())
            .unwrap_or_default()
    }

    /// For the first sequence of a request that asked for prompt logprobs (the one that
    /// scores them): the first prompt position whose successor is not scored yet (a
    /// recompute after preemption does not score again).
    pub fn prompt_logprobs_from(&self, seq: &Sequence) -> Option<usize> {
        let req = self.requests.get(&seq.request)?;
        if req.seqs.first()?.id != seq.id {
            return None;
        }
        Some(req.prompt_logprobs.as_ref()?.len() - 1)
    }

    /// Scores the prompt tokens after `positions` from the logits rows starting at `first_row`.
    pub fn record_prompt_logprobs(
        &mut self,
        id: &RequestId,
        (first_row, positions): (usize, Range<usize>),
        logits: &[f32],
        vocab: usize,
    ) {
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        let k = req.params.prompt_logprobs.unwrap_or(0);
        let Some(out) = req.prompt_logprobs.as_mut() else {
            return;
        };
        for (row, pos) in (first_row..).zip(positions) {
            let next = req.prompt_ids[pos + 1];
            let (lp, top, rank) = logprobs_for(&logits[row * vocab..(row + 1) * vocab], next, k);
            out.push(Some(with_chosen(next, lp, top, rank)));
        }
    }

    fn state_mut(&mut self, seq: &Sequence) -> (&SamplingParams, &mut SeqState, usize) {
        let req = self
            .requests
            .get_mut(&seq.request)
            .expect("a running sequence's request exists");
        let st = req
            .seqs
            .iter_mut()
            .find(|s| s.id == seq.id)
            .expect("a running sequence's state exists");
        (&req.params, st, req.max_tokens)
    }

    /// Samples one token for each of `seqs` from its row of `logits`.
    pub fn sample(
        &mut self,
        sampler: &mut Sampler,
        logits: &mut [f32],
        seqs: &[&Sequence],
    ) -> Vec<SampledToken> {
        // Each RNG is copied out while the contexts borrow the requests, and written back.
        let mut states: Vec<SeqSamplingState> = seqs
            .iter()
            .map(|s| self.state_mut(s).1.sampling.clone())
            .collect();
        let eos = self.tokenizer.eos_token_ids();
        let mut ctxs: Vec<SamplingContext<'_>> = seqs
            .iter()
            .zip(states.iter_mut())
            .map(|(s, state)| SamplingContext {
                options: self.requests[&s.request].params.sampling_options(),
                prompt_ids: &s.token_ids[..s.prompt_len],
                output_ids: s.output_ids(),
                eos_token_ids: eos,
                state,
            })
            .collect();
        let results = sampler.sample(logits, &mut ctxs);
        drop(ctxs);
        for (s, st) in seqs.iter().zip(states) {
            self.state_mut(s).1.sampling = st;
        }
        results
    }

    /// Records the token just sampled for `seq` (and already appended to it): logprobs,
    /// text, stop checks. Returns whether the sequence is now finished.
    pub fn process_sample(&mut self, seq: &Sequence, s: SampledToken) -> Result<bool, EngineError> {
        let tokenizer = Arc::clone(&self.tokenizer);
        let max_model_len = self.max_model_len;
        let (p, st, max_tokens) = self.state_mut(seq);
        st.cumulative_logprob += s.logprob as f64;
        if p.logprobs.is_some() {
            // The sampler ranks the token whenever logprobs are asked for.
            let rank = s.rank.unwrap_or(0);
            st.logprobs
                .push(with_chosen(s.token_id, s.logprob, s.top_logprobs, rank));
        }
        let stop_str = st.detok.push(&tokenizer, s.token_id)?;
        let n_out = seq.output_ids().len();
        let after_min = n_out >= p.min_tokens;
        let finish = if let Some(stop) = stop_str {
            Some((FinishReason::Stop, Some(stop)))
        } else if p.stop_token_ids.contains(&s.token_id) && after_min {
            Some((FinishReason::Stop, Some(StopReason::Token(s.token_id))))
        } else if !p.ignore_eos && after_min && tokenizer.eos_token_ids().contains(&s.token_id) {
            Some((FinishReason::Stop, None))
        } else if n_out >= max_tokens || seq.len() >= max_model_len {
            Some((FinishReason::Length, None))
        } else {
            None
        };
        if finish.is_some() {
            st.detok.finish();
            st.finish = finish;
        }
        Ok(st.finish.is_some())
    }

    /// Takes over a finished sequence's output ids from the scheduler.
    pub fn on_finished(&mut self, seq: Sequence) {
        let prompt_len = seq.prompt_len;
        let mut ids = seq.token_ids;
        ids.drain(..prompt_len);
        let Some(req) = self.requests.get_mut(&seq.request) else {
            return;
        };
        if let Some(st) = req.seqs.iter_mut().find(|s| s.id == seq.id) {
            st.finished_ids = ids;
        }
    }

    /// The outputs of `requests` (those this step advanced), each of its request's kind;
    /// finished requests are forgotten afterwards.
    pub fn make_outputs(
        &mut self,
        requests: &[RequestId],
        scheduler: &Scheduler,
    ) -> Vec<RequestOutput> {
        requests
            .iter()
            .filter_map(|id| self.make_output(id, scheduler))
            .collect()
    }

    fn make_output(&mut self, id: &RequestId, scheduler: &Scheduler) -> Option<RequestOutput> {
        let req = self.requests.get_mut(id)?;
        let p = &req.params;
        let width = p.best_of_or_n().max(p.n);
        let finished = req.seqs.iter().all(|s| s.finish.is_some());
        let kind = p.output_kind;
        if kind == RequestOutputKind::FinalOnly && !finished {
            return None;
        }
        let mut outputs: Vec<(f64, CompletionOutput)> = Vec::with_capacity(req.seqs.len());
        for (index, st) in req.seqs.iter_mut().enumerate() {
            if let Some(out) = completion(st, index, p, kind, scheduler) {
                outputs.push((st.cumulative_logprob, out));
            }
        }
        if kind == RequestOutputKind::Delta && outputs.is_empty() && !finished {
            return None;
        }
        if finished && width > p.n {
            // best_of: keep the n most likely completions, renumbered in that order.
            outputs.sort_by(|a, b| b.0.total_cmp(&a.0));
            outputs.truncate(p.n);
            for (i, (_, o)) in outputs.iter_mut().enumerate() {
                o.index = i;
            }
        }
        let prompt_logprobs = match kind {
            RequestOutputKind::Cumulative => req.prompt_logprobs.clone(),
            // Sent once, with the first output (prefill is complete by then).
            _ => req.prompt_logprobs.take(),
        };
        let out = RequestOutput {
            request_id: id.0.clone(),
            prompt: req.prompt.clone(),
            prompt_token_ids: req.prompt_ids.clone(),
            prompt_logprobs,
            outputs: outputs.into_iter().map(|(_, o)| o).collect(),
            finished,
        };
        if finished {
            self.requests.remove(id);
        }
        Some(out)
    }
}

/// One completion's output of `kind`: everything so far, or (`DELTA`) only what earlier
/// outputs did not carry, `None` when that is nothing.
fn completion(
    st: &mut SeqState,
    index: usize,
    p: &SamplingParams,
    kind: RequestOutputKind,
    scheduler: &Scheduler,
) -> Option<CompletionOutput> {
    let ids = st.output_ids(scheduler);
    let finished = st.finish.is_some();
    let text = if finished {
        st.detok.output_text()
    } else {
        st.detok.visible_text()
    };
    let delta = kind == RequestOutputKind::Delta;
    let (num_ids, text_len) = (ids.len(), text.len());
    if delta && st.sent.tokens == num_ids && (!finished || st.sent.finish) {
        return None;
    }
    let (from_token, from_text) = if delta {
        (st.sent.tokens, st.sent.text)
    } else {
        (0, 0)
    };
    let out = CompletionOutput {
        index,
        text: text.get(from_text..).unwrap_or("").to_string(),
        token_ids: ids[from_token..].to_vec(),
        cumulative_logprob: Some(st.cumulative_logprob),
        logprobs: p.logprobs.map(|_| st.logprobs[from_token..].to_vec()),
        finish_reason: st.finish.as_ref().map(|f| f.0),
        stop_reason: st.finish.as_ref().and_then(|f| f.1.clone()),
    };
    if delta {
        st.sent = Sent {
            tokens: num_ids,
            text: text_len.max(st.sent.text),
            finish: finished,
        };
    }
    Some(out)
}

/// The chosen token's entry first, then the top-k without repeating it.
fn with_chosen(
    token: TokenId,
    logprob: f32,
    top: Vec<(TokenId, f32)>,
    rank: usize,
) -> TokenLogprobs {
    let mut v = Vec::with_capacity(top.len() + 1);
    v.push((token, logprob));
    v.extend(top.into_iter().filter(|(t, _)| *t != token));
    TokenLogprobs::new(v, rank)
}
