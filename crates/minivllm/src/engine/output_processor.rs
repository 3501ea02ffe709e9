//! What happens to a step's results before callers see them (vLLM v1's
//! `OutputProcessor`): each sequence's text (incremental detokenisation) and stop strings,
//! its logprobs, the gathering of a request's `n` (or `best_of`) sequences into one output,
//! and `RequestOutput`s of the kind the request asked for.
//!
//! It takes the scheduler's `EngineCoreOutput`s and reads the sequences' tokens from the
//! scheduler's records of them (`sequence::Sequences`), which it never changes: a stop
//! string it finds goes back as a sequence for the engine to finish there. A finished
//! sequence's record passes to it ([`OutputProcessor::retire`]) while its request's
//! outputs still show it, so each token is kept in one place at a time.

use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::detokenizer::{DetokenizerConfig, IncrementalDetokenizer};
use crate::engine::errors::EngineError;
use crate::engine::input_processor::ProcessedPrompt;
use crate::engine::metrics::{FinishedRequest, RequestHistograms};
use crate::engine::stop_strings::StopStrings;
use crate::engine::tokenizer::Tokenizer;
use crate::ids::{RequestId, SeqId, TokenId};
use crate::outputs::{
    Arrival, CompletionOutput, EngineCoreOutput, RequestMetrics, RequestOutput, TokenLogprobs,
};
use crate::sampling_params::{RequestOutputKind, SamplingParams};
use crate::sequence::{FinishReason, Sequence, Sequences, StopReason};

/// Every unfinished request's state beyond what the scheduler keeps.
pub(crate) struct OutputProcessor {
    tokenizer: Arc<Tokenizer>,
    requests: HashMap<RequestId, RequestState>,
    /// Observed as requests' metrics are stamped.
    histograms: RequestHistograms,
}

/// What one step did to the requests it ran.
pub(crate) struct ProcessedOutputs {
    pub request_outputs: Vec<RequestOutput>,
    /// Sequences a stop string ended, for the scheduler to finish.
    pub stopped: Vec<SeqId>,
}

struct RequestState {
    prompt: Option<Arc<str>>,
    prompt_ids: Arc<[TokenId]>,
    params: Arc<SamplingParams>,
    /// Entry `e` scores prompt token `e` (entry 0 is `None`: nothing comes before it).
    prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    /// By completion index: `n` (or `best_of`) sibling sequences (vLLM v1's parallel
    /// sampling: child requests of one parent), which share the prompt's K/V through the
    /// prefix cache.
    seqs: Vec<SeqState>,
    /// An embedding request's vector, once its prompt is done.
    pooled: Option<Vec<f32>>,
    /// Its first completion's prompt tokens found in the prefix cache.
    num_cached_tokens: usize,
    metrics: RequestMetrics,
    /// Its arrival at the front: every later stamp is read from its monotonic clock.
    arrival: Arrival,
    /// Tokens generated over all its completions, and of those in the step being processed.
    num_generation_tokens: usize,
    num_step_tokens: usize,
}

impl RequestState {
    /// Now, as Unix time on the request's monotonic clock.
    fn now(&self) -> f64 {
        self.arrival.now_unix()
    }
}

struct SeqState {
    id: SeqId,
    detok: IncrementalDetokenizer,
    cumulative_logprob: f64,
    logprobs: Vec<TokenLogprobs>,
    finish: Option<(FinishReason, Option<StopReason>)>,
    /// Its output tokens taken in so far: the output shows these (a stop string may end it
    /// before tokens the scheduler appended in the same step).
    num_tokens: usize,
    /// Its tokens, prompt first, once it has finished and the scheduler let its record go;
    /// until then they are read from the scheduler's record.
    retired_tokens: Option<Vec<TokenId>>,
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
    fn new(id: SeqId, detok: IncrementalDetokenizer) -> Self {
        Self {
            id,
            detok,
            cumulative_logprob: 0.0,
            logprobs: Vec::new(),
            finish: None,
            num_tokens: 0,
            retired_tokens: None,
            sent: Sent::default(),
        }
    }
}

impl OutputProcessor {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Self {
            tokenizer,
            requests: HashMap::new(),
            histograms: RequestHistograms::default(),
        }
    }

    /// Latency histograms and outcome counts of the requests processed so far.
    pub fn histograms(&self) -> &RequestHistograms {
        &self.histograms
    }

    pub fn contains(&self, id: &RequestId) -> bool {
        self.requests.contains_key(id)
    }

    /// No request is unfinished.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// The scheduler gave these sequences their first step (or their first after a
    /// preemption): their requests' `first_scheduled_time`, where it is not set yet.
    pub fn scheduled(&mut self, ids: impl IntoIterator<Item = SeqId>, seqs: &Sequences) {
        for id in ids {
            if let Some(req) = seqs
                .get(&id)
                .and_then(|s| self.requests.get_mut(&s.request))
            {
                let now = req.now();
                req.metrics.scheduled(now);
            }
        }
    }

    /// Takes the record of a sequence the scheduler has finished with: its request's
    /// outputs show its tokens until the request ends.
    pub(crate) fn retire(&mut self, seq: Sequence) {
        if let Some(req) = self.requests.get_mut(&seq.request) {
            if let Some(st) = req.seqs.get_mut(seq.index).filter(|st| st.id == seq.id) {
                st.retired_tokens = Some(seq.token_ids);
            }
        }
    }

    /// Takes a validated request whose sequences (`n`, or `best_of`) the scheduler runs as
    /// `seq_ids`, in completion order, with its stop strings' automaton and its arrival.
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt: ProcessedPrompt,
        params: Arc<SamplingParams>,
        stop: Option<Arc<StopStrings>>,
        seq_ids: &[SeqId],
        arrival: Arrival,
    ) {
        let cfg = DetokenizerConfig {
            skip_special_tokens: params.skip_special_tokens,
            spaces_between_special_tokens: params.spaces_between_special_tokens,
            stop,
            include_stop_str_in_output: params.include_stop_str_in_output,
        };
        let detok = IncrementalDetokenizer::new(&self.tokenizer, &prompt.token_ids, cfg);
        // Cloning shares the stop-string automaton instead of building one per sibling.
        let states = seq_ids
            .iter()
            .map(|&seq| SeqState::new(seq, detok.clone()))
            .collect();
        let state = RequestState {
            prompt: prompt.text.map(Arc::from),
            prompt_ids: Arc::from(prompt.token_ids),
            prompt_logprobs: params.prompt_logprobs.map(|_| vec![None]),
            seqs: states,
            params,
            pooled: None,
            num_cached_tokens: 0,
            metrics: RequestMetrics::arrived_at(&arrival),
            arrival,
            num_generation_tokens: 0,
            num_step_tokens: 0,
        };
        self.requests.insert(id, state);
    }

    /// Forgets a request that ended before it finished (`reason`: abort or error); returns
    /// its sequences, for the scheduler to free.
    pub fn abort_request(&mut self, id: &RequestId, reason: FinishReason) -> Vec<SeqId> {
        let Some(req) = self.requests.remove(id) else {
            return Vec::new();
        };
        self.histograms.on_ended_early(reason);
        req.seqs.iter().map(|s| s.id).collect()
    }

    /// Takes in a step's results, one per scheduled sequence in the step's order: the
    /// prompt logprobs scored, each new token's logprobs and text, stop strings; returns the
    /// outputs of the requests the step ran (each once, in order of their first sequence)
    /// and the sequences a stop string ended.
    pub(crate) fn process_outputs(
        &mut self,
        outputs: Vec<EngineCoreOutput>,
        seqs: &Sequences,
    ) -> Result<ProcessedOutputs, EngineError> {
        let mut requests: Vec<&RequestId> = Vec::new();
        let mut stopped = Vec::new();
        for o in outputs {
            let Some(seq) = seqs.get(&o.seq) else {
                continue;
            };
            let (request, index) = (&seq.request, seq.index);
            let Some(req) = self.requests.get_mut(request) else {
                continue;
            };
            if req.seqs[index].finish.is_some() {
                // A stop string ended it earlier in this step.
                continue;
            }
            if !requests.contains(&request) {
                requests.push(request);
            }
            if index == 0 {
                req.num_cached_tokens = o.num_cached_tokens;
            }
            req.num_step_tokens += usize::from(o.new_token.is_some());
            if let (Some(scored), Some(all)) = (o.prompt_logprobs, req.prompt_logprobs.as_mut()) {
                all.extend(scored.into_iter().map(Some));
            }
            if let Some(vector) = o.pooled {
                req.pooled = Some(vector);
                req.seqs[index].finish = o.finish;
                continue;
            }
            let Some(token) = o.new_token else {
                continue;
            };
            let st = &mut req.seqs[index];
            st.cumulative_logprob += token.logprob as f64;
            if req.params.logprobs.is_some() {
                // The sampler ranks the token whenever logprobs are asked for.
                let rank = token.rank.unwrap_or(0);
                st.logprobs.push(TokenLogprobs::with_chosen(
                    token.token_id,
                    token.logprob,
                    token.top_logprobs,
                    rank,
                ));
            }
            st.num_tokens += 1;
            // The EOS or stop token that ended the sequence is not text (vLLM's rule; it
            // shows only with skip_special_tokens off, or for a stop id of a plain token).
            let stop_token = o.stop_token && !req.params.include_stop_str_in_output;
            let stop_str = match stop_token {
                true => None,
                false => st.detok.push(&self.tokenizer, token.token_id)?,
            };
            // A stop string wins over what the scheduler saw in the same token.
            let finish = match stop_str {
                Some(stop) => {
                    if o.finish.is_none() {
                        stopped.push(o.seq);
                    }
                    Some((FinishReason::Stop, Some(stop)))
                }
                None => o.finish,
            };
            if finish.is_some() {
                st.detok.finish();
                st.finish = finish;
            }
        }
        for &id in &requests {
            let req = self.requests.get_mut(id).expect("a request the step ran");
            if req.num_step_tokens > 0 {
                let now = req.now();
                let since_previous = req.metrics.tokens(now);
                (self.histograms).on_tokens(now - req.metrics.arrival_time, since_previous);
                req.num_generation_tokens += std::mem::take(&mut req.num_step_tokens);
            }
        }
        let request_outputs = requests
            .iter()
            .filter_map(|id| self.make_output(id, seqs))
            .collect();
        Ok(ProcessedOutputs {
            request_outputs,
            stopped,
        })
    }

    fn make_output(&mut self, id: &RequestId, seqs: &Sequences) -> Option<RequestOutput> {
        let req = self.requests.get_mut(id)?;
        let p = &req.params;
        let width = p.num_sequences();
        let finished = req.seqs.iter().all(|s| s.finish.is_some());
        if finished && req.metrics.finished_time.is_none() {
            let now = req.now();
            req.metrics.finished(now);
            let m = &req.metrics;
            self.histograms.on_finished(&FinishedRequest {
                reason: req
                    .seqs
                    .first()
                    .and_then(|s| s.finish.as_ref())
                    .map(|(r, _)| *r),
                e2e_latency: now - m.arrival_time,
                num_prompt_tokens: req.prompt_ids.len(),
                num_generation_tokens: req.num_generation_tokens,
                decode_time: m
                    .first_token_time
                    .zip(m.last_token_time)
                    .map(|(f, l)| l - f),
                num_decode_tokens: (req.seqs.iter().map(|s| s.num_tokens).max()).unwrap_or(0),
            });
        }
        // best_of > n ranks its completions only at the end: it has no earlier output
        // that the final one would not contradict.
        let kind = match width > p.n {
            true => RequestOutputKind::FinalOnly,
            false => p.output_kind,
        };
        if kind == RequestOutputKind::FinalOnly && !finished {
            return None;
        }
        let mut outputs: Vec<(f64, CompletionOutput)> = Vec::with_capacity(req.seqs.len());
        let prompt_len = req.prompt_ids.len();
        for (index, st) in req.seqs.iter_mut().enumerate() {
            // Taken out while the rest of its state is written.
            let retired = st.retired_tokens.take();
            let tokens = match &retired {
                Some(tokens) => tokens,
                None => seqs.get(&st.id).map_or(&[][..], |s| &s.token_ids),
            };
            let ids = tokens
                .get(prompt_len..prompt_len + st.num_tokens)
                .unwrap_or(&[]);
            if let Some(out) = completion(st, ids, index, p, kind) {
                outputs.push((st.cumulative_logprob, out));
            }
            st.retired_tokens = retired;
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
        if req.pooled.is_some() {
            // An embedding request: its vector is the output.
            outputs.clear();
        }
        let prompt_logprobs = match kind {
            RequestOutputKind::Cumulative => req.prompt_logprobs.clone(),
            // Sent once, with the first output (prefill is complete by then).
            _ => req.prompt_logprobs.take(),
        };
        let out = RequestOutput {
            request_id: id.0.clone(),
            prompt: req.prompt.clone(),
            prompt_token_ids: Arc::clone(&req.prompt_ids),
            prompt_logprobs,
            outputs: outputs.into_iter().map(|(_, o)| o).collect(),
            finished,
            pooled: req.pooled.take(),
            num_cached_tokens: req.num_cached_tokens,
            metrics: Some(req.metrics),
            kv_transfer_params: None,
        };
        if finished {
            self.requests.remove(id);
        }
        Some(out)
    }
}

/// One completion's output of `kind` (its output tokens `ids`): everything so far, or (`DELTA`) only what earlier
/// outputs did not carry, `None` when that is nothing.
fn completion(
    st: &mut SeqState,
    ids: &[TokenId],
    index: usize,
    p: &SamplingParams,
    kind: RequestOutputKind,
) -> Option<CompletionOutput> {
    let finished = st.finish.is_some();
    let text = if finished {
        st.detok.output_text()
    } else {
        st.detok.visible_text()
    };
    let delta = kind == RequestOutputKind::Delta;
    let (num_ids, text_len) = (ids.len(), text.len());
    // A delta's tokens travel with the text they release: tokens whose text is held back
    // (half a character, a possible stop string) wait for it, so a stream can send each
    // delta as it comes, logprobs with their text.
    let nothing_new = match finished {
        true => st.sent.finish,
        false => text_len <= st.sent.text,
    };
    if delta && nothing_new {
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

#[cfg(test)]
mod tests;
