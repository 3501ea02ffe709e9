//! Picks each sequence's next token from its row of logits, in vLLM's order: logit bias,
//! the min_tokens ban, penalties, then argmax (greedy) or temperature, top-k, top-p, min-p
//! and a draw from the sequence's own RNG.
//!
//! Logprobs are taken from the raw logits (vLLM's default `raw_logprobs` mode), before any
//! of the above changes them.

pub(crate) use minivllm_kernels::argmax::argmax;
use minivllm_kernels::softmax::{log_softmax_at, log_softmax_inplace, softmax_inplace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::ids::TokenId;
use crate::model_executor::sampling_metadata::{SamplingOptions, TokenBitmask};

/// vLLM raises temperatures in (0, 0.01) to this; doing the same keeps near-greedy requests
/// sampling the distribution they would get there.
const MIN_TEMPERATURE: f32 = 1e-2;

/// A sequence's sampling state that outlives one step: its RNG.
#[derive(Debug, Clone)]
pub(crate) struct SeqSamplingState {
    rng: ChaCha8Rng,
}

impl SeqSamplingState {
    /// Seeded: the request's seed picks the key and the sequence's index in the request the
    /// ChaCha stream, so the `n` completions differ yet each is reproducible. Unseeded: keyed
    /// from the thread's entropy.
    pub fn new(seed: Option<u64>, seq_index_in_request: usize) -> Self {
        let rng = match seed {
            Some(seed) => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(seq_index_in_request as u64);
                rng
            }
            None => ChaCha8Rng::from_rng(&mut rand::rng()),
        };
        Self { rng }
    }
}

/// What the sampler needs to know about one sequence for one row of logits.
pub(crate) struct SamplingContext<'a> {
    pub options: SamplingOptions<'a>,
    pub prompt_ids: &'a [TokenId],
    pub output_ids: &'a [TokenId],
    /// Tokens sampled for it earlier in this step (the draft tokens it kept), after
    /// `output_ids`.
    pub accepted: &'a [TokenId],
    /// Banned, with `options.stop_token_ids`, until `min_tokens` tokens have been generated.
    pub eos_token_ids: &'a [TokenId],
    /// The only tokens it may sample, when a grammar constrains it.
    pub allowed: Option<&'a TokenBitmask>,
    pub state: &'a mut SeqSamplingState,
}

/// One sampled token and its raw log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub token_id: TokenId,
    /// The token's log-probability under the raw logits.
    pub logprob: f32,
    /// The `options.logprobs` most likely tokens under the raw logits, most likely first
    /// (ties by token id); empty when `logprobs` is `None`.
    pub top_logprobs: Vec<(TokenId, f32)>,
    /// vLLM's rank of the token: how many tokens are at least as likely (1 for the most
    /// likely). Only computed when `logprobs` is set.
    pub rank: Option<usize>,
}

/// Samples rows of logits. Holds scratch buffers so that steady decoding allocates only the
/// returned tokens.
#[derive(Debug, Default)]
pub(crate) struct Sampler {
    /// The current row's raw logits, copied where bias, bans or penalties change the row
    /// or top logprobs are asked for (then rewritten as their log-softmax).
    raw: Vec<f32>,
    /// The current row's probabilities after temperature.
    probs: Vec<f32>,
    /// (token, probability) still allowed by top-k / top-p / min-p.
    cands: Vec<(u32, f32)>,
    /// Token indices, for the top logprobs.
    idx: Vec<u32>,
    /// Vocab-wide occurrence counts for the penalties; all zero between uses.
    counts: Vec<u32>,
    /// The tokens whose `counts` entry is non-zero.
    touched: Vec<u32>,
}

impl Sampler {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// Samples one token per context from `logits` (`ctxs.len()` rows of the vocabulary).
    /// On return each row holds the processed logits (bias, bans, penalties; before
    /// temperature). Only each sequence's own RNG is used, one draw per random sample, so a
    /// seeded request gets the same tokens whatever else is in the batch.
    #[cfg(test)]
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        ctxs: &mut [SamplingContext<'_>],
    ) -> Vec<SampledToken> {
        if ctxs.is_empty() {
            return Vec::new();
        }
        let vocab = logits.len() / ctxs.len();
        assert!(
            vocab > 0 && vocab * ctxs.len() == logits.len(),
            "sampler: {} logits do not make {} rows",
            logits.len(),
            ctxs.len()
        );
        logits
            .chunks_exact_mut(vocab)
            .zip(ctxs.iter_mut())
            .map(|(row, ctx)| self.sample_row(row, ctx))
            .collect()
    }

    /// Samples one token from one row of logits (see [`sample`](Self::sample)).
    pub(crate) fn sample_row(
        &mut self,
        row: &mut [f32],
        ctx: &mut SamplingContext<'_>,
    ) -> SampledToken {
        let params = ctx.options;
        if let Some(mask) = ctx.allowed {
            mask.apply(row);
        }
        let banning = ctx.output_ids.len() + ctx.accepted.len() < params.min_tokens;
        let penalised = params.repetition_penalty != 1.0
            || params.frequency_penalty != 0.0
            || params.presence_penalty != 0.0;
        // Logprobs come from the raw row: copied only where the row is about to change.
        let changes = banning || penalised || !params.logit_bias.is_empty();
        if changes {
            self.raw.clear();
            self.raw.extend_from_slice(row);
        }

        // Ids past the vocabulary are rejected by validation; skipping them here keeps a
        // request that slipped through from taking the batch down.
        for (&token, &bias) in params.logit_bias {
            if let Some(l) = row.get_mut(token as usize) {
                *l += bias;
            }
        }
        if banning {
            // vLLM bans EOS here even with ignore_eos.
            for &token in ctx.eos_token_ids.iter().chain(params.stop_token_ids) {
                if let Some(l) = row.get_mut(token as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        if penalised {
            self.apply_penalties(row, &params, ctx.prompt_ids, [ctx.output_ids, ctx.accepted]);
        }

        let token = if params.greedy {
            argmax(row)
        } else {
            self.sample_random(row, &params, &mut ctx.state.rng)
        };

        let (logprob, top_logprobs, rank) = match params.logprobs {
            None => {
                let raw = if changes { &self.raw[..] } else { row };
                (log_softmax_at(raw, token), Vec::new(), None)
            }
            Some(k) => {
                if !changes {
                    self.raw.clear();
                    self.raw.extend_from_slice(row);
                }
                log_softmax_inplace(&mut self.raw);
                let logprob = self.raw[token];
                (
                    logprob,
                    top_k_desc(&self.raw, k, &mut self.idx),
                    Some(self.raw.iter().filter(|&&lp| lp >= logprob).count()),
                )
            }
        };
        SampledToken {
            token_id: token as TokenId,
            logprob,
            top_logprobs,
            rank,
        }
    }

    /// vLLM's `apply_penalties`: repetition over the prompt and output (each token once),
    /// then frequency and presence over the output.
    fn apply_penalties(
        &mut self,
        row: &mut [f32],
        params: &SamplingOptions<'_>,
        prompt: &[TokenId],
        output: [&[TokenId]; 2],
    ) {
        let output = || output.into_iter().flatten();
        let vocab = row.len();
        if self.counts.len() != vocab {
            self.counts.clear();
            self.counts.resize(vocab, 0);
        }
        let rp = params.repetition_penalty;
        if rp != 1.0 {
            self.count(prompt.iter().chain(output()));
            for &t in &self.touched {
                let l = &mut row[t as usize];
                *l = if *l > 0.0 { *l / rp } else { *l * rp };
                self.counts[t as usize] = 0;
            }
        }
        let (fp, pp) = (params.frequency_penalty, params.presence_penalty);
        if fp != 0.0 || pp != 0.0 {
            self.count(output());
            for &t in &self.touched {
                let t = t as usize;
                row[t] -= fp * self.counts[t] as f32;
                row[t] -= pp;
                self.counts[t] = 0;
            }
        }
    }

    /// Counts tokens into `counts` (ids past the vocabulary are skipped), listing the
    /// distinct ones in `touched`.
    fn count<'t>(&mut self, tokens: impl Iterator<Item = &'t TokenId>) {
        self.touched.clear();
        for &t in tokens {
            if let Some(c) = self.counts.get_mut(t as usize) {
                if *c == 0 {
                    self.touched.push(t);
                }
                *c += 1;
            }
        }
    }

    fn sample_random(
        &mut self,
        row: &[f32],
        params: &SamplingOptions<'_>,
        rng: &mut ChaCha8Rng,
    ) -> usize {
        // Drawn first and always, so the stream advances once per sample whatever the filters.
        let u: f64 = rng.random();
        let temperature = params.temperature.max(MIN_TEMPERATURE);
        self.probs.clear();
        self.probs.extend(row.iter().map(|&l| l / temperature));
        softmax_inplace(&mut self.probs);
        let probs = &self.probs;

        let vocab = row.len();
        let top_k = params.top_k.filter(|&k| k < vocab);
        let top_p = (params.top_p < 1.0).then_some(params.top_p);
        let min_p = (params.min_p > 0.0).then_some(params.min_p);
        if top_k.is_none() && top_p.is_none() && min_p.is_none() {
            let weights = probs.iter().enumerate().map(|(i, &p)| (i, p));
            return pick(weights, u).unwrap_or_else(|| argmax(row));
        }

        // min-p keeps the tokens with p >= min_p * p_max, a tail cut of the same order top-p
        // walks; applying it before top-p, while measuring top-p against the mass before the
        // cut, keeps the exact top-k → top-p → min-p result and spares top-p the long tail.
        let cands = &mut self.cands;
        cands.clear();
        let mass: f64;
        match top_k {
            Some(k) => {
                cands.extend(probs.iter().enumerate().map(|(i, &p)| (i as u32, p)));
                cands.select_nth_unstable_by(k - 1, by_prob_desc);
                cands.truncate(k);
                mass = cands.iter().map(|c| c.1 as f64).sum();
                if let Some(min_p) = min_p {
                    let threshold = min_p * cands.iter().map(|c| c.1).fold(0.0, f32::max);
                    cands.retain(|c| c.1 >= threshold);
                }
            }
            None => {
                mass = probs.iter().map(|&p| p as f64).sum();
                let threshold = match min_p {
                    Some(min_p) => min_p * probs.iter().copied().fold(0.0, f32::max),
                    None => 0.0,
                };
                // Zero-probability tokens (banned ones) can neither be drawn nor move top-p.
                cands.extend(
                    probs
                        .iter()
                        .enumerate()
                        .filter(|&(_, &p)| p > 0.0 && p >= threshold)
                        .map(|(i, &p)| (i as u32, p)),
                );
            }
        }
        if let Some(top_p) = top_p {
            let kept = top_p_prefix(cands, top_p as f64 * mass);
            cands.truncate(kept);
        }
        let weights = cands.iter().map(|&(t, p)| (t as usize, p));
        pick(weights, u).unwrap_or_else(|| argmax(row))
    }
}

/// Raw log-probability of `next_token` at this row, and the `k` most likely tokens (most
/// likely first), as the sampler reports them; for prompt logprobs. A token past the
/// vocabulary gets `-inf`.
pub(crate) fn logprobs_for(
    row: &[f32],
    next_token: TokenId,
    k: usize,
) -> (f32, Vec<(TokenId, f32)>, usize) {
    let mut lp = row.to_vec();
    log_softmax_inplace(&mut lp);
    let top = top_k_desc(&lp, k, &mut Vec::new());
    let logprob = lp
        .get(next_token as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    // The sampler's rank: how many tokens are at least as likely.
    let rank = lp.iter().filter(|&&x| x >= logprob).count();
    (logprob, top, rank)
}

fn by_prob_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `k` largest values with their indices, largest first (ties by index), in
/// O(n + k log k): a full sort of the vocabulary per token would dominate sampling.
fn top_k_desc(values: &[f32], k: usize, idx: &mut Vec<u32>) -> Vec<(TokenId, f32)> {
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    idx.clear();
    idx.extend(0..values.len() as u32);
    let desc = |a: &u32, b: &u32| {
        values[*b as usize]
            .total_cmp(&values[*a as usize])
            .then(a.cmp(b))
    };
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, desc);
    }
    idx.truncate(k);
    idx.sort_unstable_by(desc);
    idx.iter().map(|&i| (i, values[i as usize])).collect()
}

/// The smallest set of most likely tokens whose mass reaches `target` (never empty), moved
/// to the front of `cands`; returns its size. A quickselect on mass: each round partitions
/// the undecided range at its middle and keeps the half holding the cut, so a flat
/// distribution, where top_p needs thousands of tokens, costs O(n) rather than a sort.
fn top_p_prefix(cands: &mut [(u32, f32)], target: f64) -> usize {
    // cands[..lo] are the lo most likely tokens, with mass `above` < target; the cut is in
    // lo + 1..=hi (or at the end when rounding leaves the whole set short of `target`).
    let (mut lo, mut hi) = (0, cands.len());
    let mut above = 0.0f64;
    while hi - lo > 64 {
        let mid = lo + (hi - lo) / 2;
        cands[lo..hi].select_nth_unstable_by(mid - lo, by_prob_desc);
        let upper: f64 = cands[lo..=mid].iter().map(|c| c.1 as f64).sum();
        if above + upper >= target {
            hi = mid + 1;
        } else {
            above += upper;
            lo = mid + 1;
        }
    }
    cands[lo..hi].sort_unstable_by(by_prob_desc);
    for (i, c) in cands[lo..hi].iter().enumerate() {
        above += c.1 as f64;
        if above >= target {
            return lo + i + 1;
        }
    }
    hi
}

/// Inverse-CDF draw: the first token whose running weight passes `u` (in [0, 1)) times the
/// total. `None` when nothing has weight.
fn pick(weights: impl Iterator<Item = (usize, f32)> + Clone, u: f64) -> Option<usize> {
    let total: f64 = weights.clone().map(|(_, w)| w as f64).sum();
    let target = u * total;
    let mut cum = 0.0f64;
    let mut last = None;
    for (i, w) in weights {
        if w > 0.0 {
            cum += w as f64;
            last = Some(i);
            if cum > target {
                return last;
            }
        }
    }
    // Rounding can leave `target` a hair above the sum.
    last
}

#[cfg(test)]
mod tests;
