//! Runs a step the scheduler laid out on one rank (vLLM v1's `GPUModelRunner`): updates its
//! state of each sequence, lays the step's tokens out as one flat batch (reading them from
//! the scheduler's records), runs the model over the KV cache, scores prompt tokens and
//! samples the next ones.
//!
//! Below that, `prepare_input` and `execute_model` lay out and run any batch and give its
//! logits (for the reference tests, perplexity, and the other ranks' workers).

use std::ops::Range;
use std::time::Instant;

use crate::core::sched_output::{reaches_end, SchedulerOutput};
use crate::ids::{BlockId, CpuBlockId, SeqId, TokenId};
use crate::model_executor::input_metadata::{InputError, InputMetadata, StateStep};
use crate::model_executor::layers::sampler::{logprobs_for, Sampler, SamplingContext};
use crate::model_executor::models::llama::{ForwardBuffers, LlamaForCausalLM};
use crate::outputs::{ModelRunnerOutput, TokenLogprobs};
use crate::sampling_params::PoolingType;
use crate::sequence::Sequences;
use crate::worker::cache_engine::CacheEngine;
use crate::worker::draft_proposer::DraftProposer;
use crate::worker::input_batch::InputBatch;

/// One scheduled sequence as the runner sees it: tokens, where its K/V live, and which of
/// its logits the step needs.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// Prompt then generated tokens.
    pub token_ids: &'a [TokenId],
    pub prompt_len: usize,
    /// Tokens whose K/V are already cached; this step computes the next `num_new`.
    pub num_computed: usize,
    pub num_new: usize,
    /// Its block table of every KV cache group.
    pub block_tables: &'a [Vec<BlockId>],
    /// For prompt logprobs: the first prompt position whose successor is still to be scored.
    pub prompt_logprobs_from: Option<usize>,
    /// Its linear-attention state slot and copies (for a model with such layers; `None`
    /// for others).
    pub state: Option<StateStep>,
}

/// Where one sequence's rows sit in the step's logits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogitsRows {
    /// Rows scoring prompt tokens: row `first + i` holds the logits at position
    /// `positions.start + i`, which score the prompt token after it.
    pub prompt: Option<(usize, Range<usize>)>,
    /// The row to sample the next token from, when the step reaches the sequence's end.
    pub sample: Option<usize>,
    /// Its new tokens' rows in the batch (an embedding request pools their hidden states).
    pub tokens: Range<usize>,
}

/// One rank's model, its KV cache, its state of each sequence and the buffers reused from
/// step to step. It runs what it is given on its own rank: telling the other ranks of a
/// tensor-parallel group is the executor's (`worker/executor.rs`).
pub struct ModelRunner {
    model: LlamaForCausalLM,
    cache: CacheEngine,
    buffers: ForwardBuffers,
    input: InputMetadata,
    /// Scratch for one sequence's block tables as the kernels index them.
    table: Vec<u32>,
    /// How many logits the last forward pass gave.
    num_logits: usize,
    /// Scratch for the rows to sample from while a batch is laid out, and their count.
    sample_rows: Vec<usize>,
    num_samples: usize,
    /// The running sequences' tokens and sampling state.
    batch: InputBatch,
    sampler: Sampler,
    /// Where each scheduled sequence's logits are; reused between steps.
    rows: Vec<LogitsRows>,
    /// Guesses the tokens after each one sampled (speculative decoding).
    proposer: Option<Box<dyn DraftProposer>>,
    /// Scratch: a sequence's tokens fed this step with its drafts after them, or its tokens
    /// with those sampled this step, for the proposer.
    tokens: Vec<TokenId>,
}

impl ModelRunner {
    /// The runner of `model`'s rank: the driver when that is rank 0.
    pub fn new(model: LlamaForCausalLM, cache: CacheEngine) -> Self {
        let input = InputMetadata::with_groups(cache.layout().num_groups());
        Self {
            model,
            cache,
            buffers: ForwardBuffers::default(),
            input,
            table: Vec::new(),
            num_logits: 0,
            sample_rows: Vec::new(),
            num_samples: 0,
            batch: InputBatch::default(),
            sampler: Sampler::default(),
            rows: Vec::new(),
            proposer: None,
            tokens: Vec::new(),
        }
    }

    /// Has `proposer` guess draft tokens after each token sampled, for the next step to
    /// verify.
    pub fn set_draft_proposer(&mut self, proposer: Box<dyn DraftProposer>) {
        self.proposer = Some(proposer);
    }

    pub fn model(&self) -> &LlamaForCausalLM {
        &self.model
    }

    pub fn cache(&self) -> &CacheEngine {
        &self.cache
    }

    /// Writes the KV pulled from prefill servers into the blocks of the sequences admitted
    /// with it (their tables' first group: a model that transfers KV has one).
    pub(crate) fn import_kv(&mut self, sched: &SchedulerOutput) {
        for import in &sched.kv_imports {
            let Some(s) = sched.scheduled.iter().find(|s| s.id == import.seq) else {
                continue;
            };
            let table = sched.block_ids(s);
            for i in import.blocks.clone() {
                (self.cache).import_block(BlockId(table[i]), import.payload.block(i));
            }
        }
    }

    /// Moves KV blocks to and from the swap pool as the scheduler ordered: swap-outs first,
    /// since a block swapped out may be a swap-in's destination.
    pub(crate) fn apply_cache_ops(
        &mut self,
        swap_out: &[(BlockId, CpuBlockId)],
        swap_in: &[(CpuBlockId, BlockId)],
    ) {
        if !swap_out.is_empty() {
            self.cache.swap_out(swap_out);
        }
        if !swap_in.is_empty() {
            self.cache.swap_in(swap_in);
        }
    }

    /// Takes in the step's changes to its per-sequence state: sequences new to the worker
    /// (read from `seqs`), and those finished since the last step.
    pub(crate) fn update_batch(&mut self, sched: &SchedulerOutput, seqs: &Sequences) {
        self.batch.update(sched, seqs);
        if let (Some(proposer), false) = (&mut self.proposer, sched.finished.is_empty()) {
            proposer.forget(&sched.finished);
        }
    }

    /// Lays the (non-empty) step `sched` out as one batch ([`input`](Self::input)), its
    /// sequences' tokens read from `seqs`.
    pub(crate) fn prepare(&mut self, sched: &SchedulerOutput, seqs: &Sequences) {
        self.begin_batch();
        let block_size = self.cache.block_size();
        for s in &sched.scheduled {
            let seq = &seqs[&s.id];
            let end = s.num_computed + s.num_new_tokens - s.spec_token_ids.len();
            // Draft tokens are fed after the last one, for this layout only.
            let new_tokens = match s.spec_token_ids.is_empty() {
                true => &seq.token_ids[s.num_computed..end],
                false => {
                    self.tokens.clear();
                    self.tokens
                        .extend_from_slice(&seq.token_ids[s.num_computed..end]);
                    self.tokens.extend_from_slice(&s.spec_token_ids);
                    &self.tokens
                }
            };
            let placed = Placement {
                new_tokens,
                num_computed: s.num_computed,
                prompt_len: seq.prompt_len,
                prompt_logprobs_from: self.batch.get_mut(s.id).prompt_logprobs_from,
                state: s.state,
                num_drafts: s.spec_token_ids.len(),
                sample: s.samples,
            };
            let (batch, samples) = (&mut self.input, &mut self.sample_rows);
            let rows = lay_out(batch, samples, block_size, &placed, sched.block_ids(s));
            self.rows.push(rows);
        }
        self.end_batch();
    }

    /// The batch laid out last: what the other ranks of a tensor-parallel group run too.
    pub fn input(&self) -> &InputMetadata {
        &self.input
    }

    /// Runs the batch [`prepare`](Self::prepare) laid out and samples: each sequence the
    /// step brings to the end of its tokens gets its next token (which the scheduler
    /// appends), prompt tokens are scored.
    pub(crate) fn run(
        &mut self,
        sched: &SchedulerOutput,
        seqs: &Sequences,
    ) -> Result<ModelRunnerOutput, InputError> {
        let mut out = ModelRunnerOutput::default();
        let forward = Instant::now();
        self.execute_model()?;
        out.forward_seconds = forward.elapsed().as_secs_f64();
        self.score_prompts(sched, seqs, &mut out.prompt_logprobs);
        self.pool(sched, seqs, &mut out.pooled);
        self.sample(sched, seqs, &mut out);
        out.run_seconds = forward.elapsed().as_secs_f64() - out.draft_seconds;
        Ok(out)
    }

    /// The prompt logprobs of the step's scoring sequences, from their rows.
    fn score_prompts(
        &mut self,
        sched: &SchedulerOutput,
        seqs: &Sequences,
        out: &mut Vec<(SeqId, Vec<TokenLogprobs>)>,
    ) {
        let vocab = self.model.config().vocab_size;
        let logits = self.buffers.logits(self.num_logits);
        for (s, rows) in sched.scheduled.iter().zip(&self.rows) {
            let Some((first_row, positions)) = rows.prompt.clone() else {
                continue;
            };
            let seq = &seqs[&s.id];
            let k = seq.params.prompt_logprobs.unwrap_or(0);
            self.batch.get_mut(s.id).prompt_logprobs_from = Some(positions.end);
            let scored = (first_row..)
                .zip(positions)
                .map(|(row, pos)| {
                    let next = seq.token_ids[pos + 1];
                    let (lp, top, rank) =
                        logprobs_for(&logits[row * vocab..(row + 1) * vocab], next, k);
                    TokenLogprobs::with_chosen(next, lp, top, rank)
                })
                .collect();
            out.push((s.id, scored));
        }
    }

    /// Pools the hidden states of the step's embedding requests: the last prompt token's,
    /// or (mean) a running sum over every chunk of the prompt; a request whose prompt ends
    /// this step gets its vector.
    fn pool(
        &mut self,
        sched: &SchedulerOutput,
        seqs: &Sequences,
        out: &mut Vec<(SeqId, Vec<f32>)>,
    ) {
        let h = self.model.config().hidden_size;
        for (s, r) in sched.scheduled.iter().zip(&self.rows) {
            let Some(pooling) = seqs[&s.id].params.pooling else {
                continue;
            };
            let prompt_len = seqs[&s.id].prompt_len;
            let seq = self.batch.get_mut(s.id);
            if s.num_computed == 0 {
                // From the start (again, after a preemption).
                seq.pooled.clear();
            }
            let end = s.num_computed + s.num_new_tokens;
            let rows = self.buffers.hidden(r.tokens.clone(), h);
            match pooling.pooling_type {
                PoolingType::Mean => {
                    seq.pooled.resize(h, 0.0);
                    for row in rows.chunks_exact(h) {
                        seq.pooled.iter_mut().zip(row).for_each(|(a, x)| *a += x);
                    }
                }
                PoolingType::Last if end == prompt_len => {
                    seq.pooled.clear();
                    seq.pooled.extend_from_slice(&rows[rows.len() - h..]);
                }
                PoolingType::Last => {}
            }
            if end == prompt_len {
                let sum = std::mem::take(&mut seq.pooled);
                out.push((s.id, pooling.finish(sum, prompt_len)));
            }
        }
    }

    /// Samples the next token of each sequence with a sample row, in the step's order, from
    /// the logits in place (the runner laid those rows out last, in that order), and asks
    /// the draft proposer, if any, for the tokens after it. A sequence with draft tokens
    /// has a row per draft position too: it samples at each in turn, with the tokens
    /// accepted before it as its history, and goes on while the token sampled is the
    /// draft's. Every position draws from the sequence's RNG as a plain decode step would,
    /// so the tokens are those plain decoding gives.
    fn sample(&mut self, sched: &SchedulerOutput, seqs: &Sequences, out: &mut ModelRunnerOutput) {
        let vocab = self.model.config().vocab_size;
        let all = self.buffers.logits_mut(self.num_logits);
        let from = all.len() - self.num_samples * vocab;
        let mut rows = all[from..].chunks_exact_mut(vocab);
        for (s, r) in sched.scheduled.iter().zip(&self.rows) {
            if r.sample.is_none() {
                continue;
            }
            let mask = sched.token_mask(s.id);
            let seq = &seqs[&s.id];
            let state = &mut self.batch.get_mut(s.id).sampling;
            let drafts = &s.spec_token_ids;
            let first = out.sampled.len();
            let mut accepting = true;
            for (i, row) in rows.by_ref().take(1 + drafts.len()).enumerate() {
                if !accepting {
                    // A draft was rejected: the rows after it are not needed.
                    continue;
                }
                let mut ctx = SamplingContext {
                    options: seq.params.sampling_options(),
                    prompt_ids: &seq.token_ids[..seq.prompt_len],
                    output_ids: &seq.token_ids[seq.prompt_len..],
                    // Those sampled before it this step: the drafts it kept.
                    accepted: &drafts[..i],
                    eos_token_ids: &seq.eos_token_ids,
                    allowed: mask,
                    state: &mut *state,
                };
                let token = self.sampler.sample_row(row, &mut ctx);
                accepting = drafts.get(i) == Some(&token.token_id);
                out.sampled.push((s.id, token));
            }
            if let (Some(proposer), 1..) = (&mut self.proposer, s.num_lookahead) {
                let started = Instant::now();
                self.tokens.clear();
                self.tokens.extend_from_slice(&seq.token_ids);
                self.tokens
                    .extend(out.sampled[first..].iter().map(|(_, t)| t.token_id));
                let drafts = proposer.propose(s.id, &self.tokens, s.num_lookahead);
                out.draft_seconds += started.elapsed().as_secs_f64();
                out.num_guesses += drafts.len();
                if !drafts.is_empty() {
                    out.draft_token_ids.push((s.id, drafts));
                }
            }
        }
    }

    /// Lays the sequences out as one flat batch (prompt chunks and decodes alike: vLLM's
    /// `prepare_prefill` and `prepare_decode` in one pass) and says where each one's logits
    /// will be, in `rows` (cleared first, one entry per sequence).
    pub fn prepare_input<'a>(
        &mut self,
        seqs: impl IntoIterator<Item = SeqInput<'a>>,
        rows: &mut Vec<LogitsRows>,
    ) {
        self.begin_batch();
        let block_size = self.cache.block_size();
        for s in seqs {
            self.table.clear();
            self.table
                .extend(s.block_tables.iter().flatten().map(|b| b.0));
            let placed = Placement {
                new_tokens: &s.token_ids[s.num_computed..s.num_computed + s.num_new],
                num_computed: s.num_computed,
                prompt_len: s.prompt_len,
                prompt_logprobs_from: s.prompt_logprobs_from,
                state: s.state,
                num_drafts: 0,
                sample: reaches_end(s.num_computed, s.num_new, s.token_ids.len()),
            };
            let r = lay_out(
                &mut self.input,
                &mut self.sample_rows,
                block_size,
                &placed,
                &self.table,
            );
            self.rows.push(r);
        }
        self.end_batch();
        rows.clone_from(&self.rows);
    }

    fn begin_batch(&mut self) {
        self.input.clear();
        self.rows.clear();
        self.sample_rows.clear();
    }

    /// The rows to sample from go last, together, in sequence order: the sampler then
    /// works on them where the model wrote them, with no copy.
    fn end_batch(&mut self) {
        let first_sample = self.input.logits_indices.len();
        for r in self.rows.iter_mut() {
            if let Some(k) = &mut r.sample {
                *k += first_sample;
            }
        }
        self.num_samples = self.sample_rows.len();
        self.input.logits_indices.append(&mut self.sample_rows);
    }

    /// Logits `[rows asked for by prepare_input, vocab_size]` for the prepared batch; also
    /// [`logits`](Self::logits) until the next batch.
    pub fn execute_model(&mut self) -> Result<&[f32], InputError> {
        self.num_logits = self.forward(None)?.len();
        Ok(self.logits())
    }

    /// [`execute_model`](Self::execute_model) without the LM head: the final hidden states
    /// of the rows asked for, `[rows, hidden_size]`.
    pub(crate) fn execute_hidden(&mut self) -> Result<&[f32], InputError> {
        self.num_logits = 0;
        let block_size = self.cache.block_size();
        let (model, cache, buffers) = (&self.model, &mut self.cache, &mut self.buffers);
        let input = &self.input;
        minivllm_kernels::threading::install(|| {
            let (kv, states) = cache.caches_mut();
            model.forward_hidden(input, kv, states, block_size, buffers)
        })
    }

    /// Logits `[rows asked for by prepare_input, vocab_size]` of the last batch run.
    pub fn logits(&self) -> &[f32] {
        self.buffers.logits(self.num_logits)
    }

    /// Frees step buffers that a large batch left grown (see
    /// `ForwardBuffers::release_if_large`); for when no request is running.
    pub fn release_idle_memory(&mut self) {
        self.buffers.release_if_large();
    }

    /// Sequences it keeps state for.
    pub(crate) fn num_cached_seqs(&self) -> usize {
        self.batch.len()
    }

    /// Runs the model on `input`, or on the batch `prepare_input` laid out.
    pub(super) fn forward(&mut self, input: Option<&InputMetadata>) -> Result<&[f32], InputError> {
        let block_size = self.cache.block_size();
        let (model, cache, buffers) = (&self.model, &mut self.cache, &mut self.buffers);
        let input = input.unwrap_or(&self.input);
        minivllm_kernels::threading::install(|| {
            let (kv, states) = cache.caches_mut();
            model.forward(input, kv, states, block_size, buffers)
        })
    }
}

/// One sequence's part of a batch, as [`lay_out`] places it.
struct Placement<'a> {
    /// The tokens fed this step: those after its `num_computed`, then its draft tokens.
    new_tokens: &'a [TokenId],
    num_computed: usize,
    prompt_len: usize,
    /// For prompt logprobs: the first prompt position whose successor is still to be scored.
    prompt_logprobs_from: Option<usize>,
    state: Option<StateStep>,
    /// How many of `new_tokens` are draft tokens, each to be sampled at.
    num_drafts: usize,
    /// It samples this step (as the scheduler decided, `ScheduledSeq::samples`).
    sample: bool,
}

/// Adds sequence `s` (its block tables flattened in `table`) to the batch in `input`, and
/// if it samples its sample rows to `sample_rows` (indices into the batch's tokens: its
/// last token's, after `num_drafts` more for the draft tokens its last new ones are);
/// returns where its logits will be, the first sample row counted among `sample_rows`
/// until `end_batch` places it.
fn lay_out(
    input: &mut InputMetadata,
    sample_rows: &mut Vec<usize>,
    block_size: usize,
    s: &Placement<'_>,
    table: &[u32],
) -> LogitsRows {
    let num_new = s.new_tokens.len();
    let end = s.num_computed + num_new;
    let start_row = input.num_tokens();
    let (new_tokens, num_drafts) = (s.new_tokens, s.num_drafts);
    input.add_sequence(new_tokens, end, table, block_size, false);
    input.states.extend(s.state);
    let mut r = LogitsRows {
        tokens: start_row..start_row + num_new,
        ..LogitsRows::default()
    };
    if let Some(from) = s.prompt_logprobs_from {
        // The last prompt position scores the first output token, not a prompt one.
        let positions = s.num_computed.max(from)..end.min(s.prompt_len - 1);
        if !positions.is_empty() {
            r.prompt = Some((input.logits_indices.len(), positions.clone()));
            let rows = positions.map(|pos| start_row + pos - s.num_computed);
            input.logits_indices.extend(rows);
        }
    }
    if s.sample {
        r.sample = Some(sample_rows.len());
        let last = start_row + num_new - 1;
        sample_rows.extend(last - num_drafts..=last);
    }
    r
}
