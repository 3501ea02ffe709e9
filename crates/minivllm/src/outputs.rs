//! What callers get back (vLLM's `RequestOutput` and `CompletionOutput`), and what a step
//! passes up on its way there: the worker's sampled tokens (`ModelRunnerOutput`), then the
//! scheduler's verdict on each sequence (`EngineCoreOutput`).

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::distributed::kv_transfer::KvTransferParams;
pub use crate::model_executor::layers::sampler::SampledToken;
use crate::sequence::{FinishReason, SeqId, StopReason, TokenId};

/// What the worker gives back for a step (vLLM v1's `ModelRunnerOutput`).
#[derive(Debug, Default)]
pub struct ModelRunnerOutput {
    /// The token sampled for each sequence the step brought to the end of its tokens, in
    /// the step's order. A sequence with draft tokens has one entry per draft accepted (those
    /// matching what was sampled at their positions), then the token sampled after the last
    /// of them: its accepted count is its number of entries less one.
    pub sampled: Vec<(SeqId, SampledToken)>,
    /// Draft tokens proposed for the sequences just sampled, to verify in the next step.
    pub draft_token_ids: Vec<(SeqId, Vec<TokenId>)>,
    /// Prompt tokens scored this step, for the sequences that score their prompt: each
    /// entry the next prompt positions' logprobs.
    pub prompt_logprobs: Vec<(SeqId, Vec<TokenLogprobs>)>,
    /// The pooled vectors of the embedding requests whose prompt ended this step.
    pub pooled: Vec<(SeqId, Vec<f32>)>,
    /// Seconds the model's forward pass took (the rest of the step is overhead).
    pub forward_seconds: f64,
    /// Seconds the forward pass and sampling took together: what a step's size costs
    /// (speculative decoding weighs its guesses by it).
    pub run_seconds: f64,
    /// Seconds the draft proposer took, for how many guesses.
    pub draft_seconds: f64,
    pub num_guesses: usize,
}

/// One scheduled sequence after the scheduler took in a step's results (vLLM v1's
/// `EngineCoreOutput`), for the output processor: one per token it appended (several for a
/// sequence whose draft tokens were accepted), or one with no token.
#[derive(Debug)]
pub struct EngineCoreOutput {
    pub seq: SeqId,
    /// The token sampled this step, if the step reached the end of its tokens.
    pub new_token: Option<SampledToken>,
    pub prompt_logprobs: Option<Vec<TokenLogprobs>>,
    /// Set when the new token ends the sequence (on ids or length: stop strings are the
    /// output processor's to find); the scheduler has freed it.
    pub finish: Option<(FinishReason, Option<StopReason>)>,
    /// The new token is the EOS or stop id that ended the sequence: not part of the text.
    pub stop_token: bool,
    /// An embedding request's vector: its prompt is done, and so is the request.
    pub pooled: Option<Vec<f32>>,
    /// Its prompt tokens the prefix cache held when it was first scheduled.
    pub num_cached_tokens: usize,
}

/// Log-probabilities at one position: the chosen (or actual) token first, then the top-k
/// without it, serialised as a JSON object keyed by token id, like vLLM's `{token_id:
/// logprob}` maps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenLogprobs {
    pub entries: Vec<(TokenId, f32)>,
    /// The first entry's rank in the vocabulary: how many tokens are at least as likely
    /// (1 for the most likely), vLLM's `Logprob.rank` for a token outside the top k.
    pub rank: usize,
    /// Whether the first entry is one of the top k (and so left out of those after it).
    pub in_top: bool,
}

impl TokenLogprobs {
    pub fn new(entries: Vec<(TokenId, f32)>, rank: usize) -> Self {
        Self {
            entries,
            rank,
            in_top: false,
        }
    }

    /// `token`'s entry first, then the top-k without repeating it.
    pub(crate) fn with_chosen(
        token: TokenId,
        logprob: f32,
        top: Vec<(TokenId, f32)>,
        rank: usize,
    ) -> Self {
        let mut v = Vec::with_capacity(top.len() + 1);
        v.push((token, logprob));
        let before = top.len();
        v.extend(top.into_iter().filter(|(t, _)| *t != token));
        Self {
            in_top: v.len() == before,
            ..Self::new(v, rank)
        }
    }

    pub fn get(&self, token: TokenId) -> Option<f32> {
        self.entries
            .iter()
            .find(|(t, _)| *t == token)
            .map(|(_, lp)| *lp)
    }

    /// Every entry with its `Logprob.rank` as vLLM reports it, best first: the top k by
    /// their place (1 for the most likely); the chosen token, when it is one of them, at
    /// the place the sampler gave it (tokens as likely by ascending id), else after them with
    /// its rank in the vocabulary. The one ranking that the server's routes and the Python
    /// `LLM` report. Linear, as it must be for `logprobs: -1`'s vocabulary-wide lists.
    pub(crate) fn ranked(&self) -> Vec<(TokenId, f32, usize)> {
        let Some((&(id, lp), rest)) = self.entries.split_first() else {
            return Vec::new();
        };
        let at = if self.in_top {
            rest.partition_point(|e| match e.1.total_cmp(&lp) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Equal => e.0 < id,
                std::cmp::Ordering::Less => false,
            })
        } else {
            rest.len()
        };
        let rank = if self.in_top { at + 1 } else { self.rank };
        let mut v = Vec::with_capacity(self.entries.len());
        v.extend(
            rest[..at]
                .iter()
                .enumerate()
                .map(|(i, &(t, x))| (t, x, i + 1)),
        );
        v.push((id, lp, rank));
        v.extend(
            rest[at..]
                .iter()
                .enumerate()
                .map(|(i, &(t, x))| (t, x, at + i + 2)),
        );
        v
    }

    /// [`ranked`](Self::ranked)'s entries in the order of vLLM's logprob dicts (the Python
    /// `Logprob` dicts, the completions API's `top_logprobs` and `prompt_logprobs`): the
    /// chosen (or actual) token first, then the others best first.
    pub fn chosen_first(&self) -> Vec<(TokenId, f32, usize)> {
        let mut v = self.ranked();
        let chosen = self.entries.first().map(|e| e.0);
        if let Some(i) = v.iter().position(|e| Some(e.0) == chosen) {
            v[..=i].rotate_right(1);
        }
        v
    }
}

impl Serialize for TokenLogprobs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.entries.len()))?;
        for (token, lp) in &self.entries {
            map.serialize_entry(&token.to_string(), lp)?;
        }
        map.end()
    }
}

/// One completion of a request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionOutput {
    pub index: usize,
    pub text: String,
    pub token_ids: Vec<TokenId>,
    pub cumulative_logprob: Option<f64>,
    /// Per generated token, when the request asked for `logprobs`.
    pub logprobs: Option<Vec<TokenLogprobs>>,
    #[serde(serialize_with = "ser_finish_reason")]
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
}

impl CompletionOutput {
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }
}

/// The state of one request after a step: everything generated so far (usable for streaming).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestOutput {
    pub request_id: String,
    /// Shared with the engine's record of the request (and every output of it): a stream's
    /// delta costs nothing for a long prompt.
    pub prompt: Option<Arc<str>>,
    pub prompt_token_ids: Arc<[TokenId]>,
    /// Per prompt position: `None` for the first, then the actual token's logprob and the top-k.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
    pub outputs: Vec<CompletionOutput>,
    pub finished: bool,
    /// An embedding request's vector (its `outputs` are empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pooled: Option<Vec<f32>>,
    /// Prompt tokens found in the prefix cache (vLLM's `num_cached_tokens`): computed by an
    /// earlier request, not this one.
    pub num_cached_tokens: usize,
    /// When it arrived, first ran, got its first and last tokens, finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<RequestMetrics>,
    /// A prefill kept for a decode server: where its KV waits (vLLM's
    /// `RequestOutput.kv_transfer_params`), on its final output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_params: Option<KvTransferParams>,
}

/// vLLM's `RequestMetrics`, in seconds since the Unix epoch: `first_scheduled_time` when the
/// scheduler first gave the request a step (before that step's forward pass), the token times
/// when steps that made tokens ended. Stamped by the engine's output processor alone, on one
/// monotonic clock read as Unix time from the request's arrival (so intervals between them
/// never go backwards with the wall clock); the server's latency histograms are observed at
/// the same stamps.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct RequestMetrics {
    pub arrival_time: f64,
    pub first_scheduled_time: Option<f64>,
    pub first_token_time: Option<f64>,
    pub last_token_time: Option<f64>,
    pub finished_time: Option<f64>,
    /// `first_scheduled_time - arrival_time`.
    pub time_in_queue: Option<f64>,
}

/// When a request arrived: when its parameters were checked, at the front (the server's
/// route, `LLM::generate`), before it waits for the engine thread (vLLM stamps
/// `arrival_time` in its API server's processor). The monotonic instant every later stamp
/// is read from, and the same moment as Unix time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival {
    pub instant: Instant,
    pub unix: f64,
}

impl Arrival {
    pub fn now() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Arrival {
            instant: Instant::now(),
            unix,
        }
    }

    /// `Instant::now()` as Unix time on this clock.
    pub(crate) fn now_unix(&self) -> f64 {
        self.unix + self.instant.elapsed().as_secs_f64()
    }
}

impl RequestMetrics {
    pub(crate) fn arrived_at(arrival: &Arrival) -> Self {
        Self {
            arrival_time: arrival.unix,
            ..Self::default()
        }
    }

    /// The scheduler gave the request a step at `now`; only the first counts (a preempted
    /// request scheduled again has still waited only once).
    pub fn scheduled(&mut self, now: f64) {
        if self.first_scheduled_time.is_none() {
            self.first_scheduled_time = Some(now);
            self.time_in_queue = Some(now - self.arrival_time);
        }
    }

    /// A step that ended at `now` gave the request new tokens; returns the time since its
    /// previous tokens, or `None` for its first (whose latency is `now - arrival_time`).
    pub fn tokens(&mut self, now: f64) -> Option<f64> {
        let since = self.last_token_time.map(|last| now - last);
        self.first_token_time.get_or_insert(now);
        self.last_token_time = Some(now);
        since
    }

    pub fn finished(&mut self, now: f64) {
        self.finished_time.get_or_insert(now);
    }
}

impl RequestOutput {
    /// Tokens generated so far, over all its completions (what `usage.completion_tokens` counts).
    pub fn num_generated_tokens(&self) -> usize {
        self.outputs.iter().map(|o| o.token_ids.len()).sum()
    }

    /// Folds the request's next `DELTA` output into this one (vLLM's `RequestOutput.add`
    /// with `aggregate`): text, token ids and logprobs are appended per completion, the
    /// rest is replaced. Appending costs what the delta holds, not the history.
    pub fn add(&mut self, next: RequestOutput) {
        for o in next.outputs {
            match self.outputs.iter_mut().find(|c| c.index == o.index) {
                Some(c) => c.append(o),
                None => {
                    let at = self.outputs.partition_point(|c| c.index < o.index);
                    self.outputs.insert(at, o);
                }
            }
        }
        if next.prompt_logprobs.is_some() {
            self.prompt_logprobs = next.prompt_logprobs;
        }
        if next.pooled.is_some() {
            self.pooled = next.pooled;
        }
        self.num_cached_tokens = next.num_cached_tokens;
        if next.metrics.is_some() {
            self.metrics = next.metrics;
        }
        if next.kv_transfer_params.is_some() {
            self.kv_transfer_params = next.kv_transfer_params;
        }
        self.finished = next.finished;
    }
}

/// vLLM's `EmbeddingOutput`: one prompt's pooled vector.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmbeddingOutput {
    pub embedding: Vec<f32>,
}

/// vLLM's `EmbeddingRequestOutput` (what `LLM.embed` returns per prompt).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmbeddingRequestOutput {
    pub request_id: String,
    pub prompt_token_ids: Arc<[TokenId]>,
    pub outputs: EmbeddingOutput,
    pub finished: bool,
}

impl From<RequestOutput> for EmbeddingRequestOutput {
    fn from(out: RequestOutput) -> Self {
        Self {
            request_id: out.request_id,
            prompt_token_ids: out.prompt_token_ids,
            outputs: EmbeddingOutput {
                embedding: out.pooled.unwrap_or_default(),
            },
            finished: out.finished,
        }
    }
}

impl CompletionOutput {
    /// Appends the next `DELTA` output of the same completion.
    pub fn append(&mut self, next: CompletionOutput) {
        self.text.push_str(&next.text);
        self.token_ids.extend_from_slice(&next.token_ids);
        match (&mut self.logprobs, next.logprobs) {
            (Some(mine), Some(more)) => mine.extend(more),
            (mine @ None, more) => *mine = more,
            (Some(_), None) => {}
        }
        self.cumulative_logprob = next.cumulative_logprob;
        self.finish_reason = next.finish_reason;
        self.stop_reason = next.stop_reason;
    }
}

fn ser_finish_reason<S: Serializer>(r: &Option<FinishReason>, s: S) -> Result<S::Ok, S::Error> {
    match r {
        Some(r) => s.serialize_str(r.as_str()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranked_puts_the_chosen_token_in_its_place() {
        let top_k = vec![(7, -0.5), (8, -1.0), (9, -2.0)];
        let at = |chosen: (TokenId, f32), vocab_rank: usize| {
            TokenLogprobs::with_chosen(chosen.0, chosen.1, top_k.clone(), vocab_rank).ranked()
        };
        // Chosen among the top k: once, where it ranks, its rank its place.
        assert_eq!(
            at((8, -1.0), 2),
            vec![(7, -0.5, 1), (8, -1.0, 2), (9, -2.0, 3)]
        );
        // Among them and as likely as others: where the sampler put it, by ascending id.
        let tied = TokenLogprobs::with_chosen(8, -0.5, vec![(7, -0.5), (8, -0.5), (9, -0.5)], 3);
        assert_eq!(
            tied.ranked(),
            vec![(7, -0.5, 1), (8, -0.5, 2), (9, -0.5, 3)]
        );
        // Outside them: after them with its rank in the vocabulary, even where it is as
        // likely as the last of them (the top k is the sampler's, ties and all).
        assert_eq!(at((3, -5.0), 40).last(), Some(&(3, -5.0, 40)));
        assert_eq!(at((3, -2.0), 4)[2..], [(9, -2.0, 3), (3, -2.0, 4)]);
        assert!(TokenLogprobs::default().ranked().is_empty());
        // vLLM's dict order: the chosen token first, its rank kept.
        let lp = TokenLogprobs::with_chosen(8, -1.0, top_k.clone(), 2);
        assert_eq!(
            lp.chosen_first(),
            vec![(8, -1.0, 2), (7, -0.5, 1), (9, -2.0, 3)]
        );
        let outside = TokenLogprobs::with_chosen(3, -5.0, top_k.clone(), 40);
        assert_eq!(outside.chosen_first()[0], (3, -5.0, 40));
    }

    #[test]
    fn serialises_with_vllm_field_names() {
        let out = RequestOutput {
            request_id: "0".into(),
            prompt: Some("Hi".into()),
            prompt_token_ids: vec![5, 6].into(),
            prompt_logprobs: Some(vec![None, Some(TokenLogprobs::new(vec![(6, -0.5)], 1))]),
            outputs: vec![CompletionOutput {
                index: 0,
                text: " there".into(),
                token_ids: vec![7],
                cumulative_logprob: Some(-0.25),
                logprobs: Some(vec![TokenLogprobs::new(vec![(7, -0.25), (8, -2.0)], 1)]),
                finish_reason: Some(FinishReason::Stop),
                stop_reason: Some(StopReason::String("\n".into())),
            }],
            finished: true,
            pooled: None,
            num_cached_tokens: 0,
            metrics: None,
            kv_transfer_params: None,
        };
        let v = serde_json::to_value(&out).unwrap();
        assert_eq!(v["prompt_logprobs"][0], serde_json::Value::Null);
        assert_eq!(v["prompt_logprobs"][1]["6"], -0.5);
        assert_eq!(v["outputs"][0]["logprobs"][0]["8"], -2.0);
        assert_eq!(v["outputs"][0]["finish_reason"], "stop");
        assert_eq!(v["outputs"][0]["stop_reason"], "\n");
        let by_token = serde_json::to_value(Some(StopReason::Token(2))).unwrap();
        assert_eq!(by_token, serde_json::json!(2));
    }

    fn completion(index: usize, text: &str, ids: &[TokenId], done: bool) -> CompletionOutput {
        CompletionOutput {
            index,
            text: text.into(),
            token_ids: ids.to_vec(),
            cumulative_logprob: Some(-(ids.len() as f64)),
            logprobs: Some(
                ids.iter()
                    .map(|&t| TokenLogprobs::new(vec![(t, -1.0)], 1))
                    .collect(),
            ),
            finish_reason: done.then_some(FinishReason::Length),
            stop_reason: None,
        }
    }

    fn request(outputs: Vec<CompletionOutput>, finished: bool) -> RequestOutput {
        RequestOutput {
            request_id: "r".into(),
            prompt: None,
            prompt_token_ids: vec![1].into(),
            prompt_logprobs: None,
            outputs,
            finished,
            pooled: None,
            num_cached_tokens: 0,
            metrics: None,
            kv_transfer_params: None,
        }
    }

    #[test]
    fn deltas_fold_into_the_cumulative_output() {
        let mut acc = request(vec![completion(1, "b", &[20], false)], false);
        acc.add(request(
            vec![
                completion(0, "a", &[10], false),
                completion(1, "c", &[21], false),
            ],
            false,
        ));
        acc.add(request(vec![completion(0, "d", &[11], true)], false));
        acc.add(request(vec![completion(1, "", &[22], true)], true));
        assert!(acc.finished);
        let texts: Vec<_> = acc
            .outputs
            .iter()
            .map(|o| (o.index, o.text.as_str()))
            .collect();
        assert_eq!(texts, [(0, "ad"), (1, "bc")]);
        assert_eq!(acc.outputs[1].token_ids, [20, 21, 22]);
        assert_eq!(acc.outputs[1].logprobs.as_ref().unwrap().len(), 3);
        assert_eq!(acc.outputs[0].finish_reason, Some(FinishReason::Length));
        // The last delta's running total, not a sum of totals.
        assert_eq!(acc.outputs[1].cumulative_logprob, Some(-1.0));
    }
}
