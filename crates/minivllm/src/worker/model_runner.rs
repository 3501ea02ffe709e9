//! Prepares one batch's inputs from the scheduled sequences and runs the model on them over
//! the KV cache.

use std::ops::Range;
use std::sync::Arc;

use crate::distributed::Communicator;
use crate::ids::{BlockId, CpuBlockId, TokenId};
use crate::model_executor::input_metadata::{InputError, InputMetadata};
use crate::model_executor::models::llama::{ForwardBuffers, LlamaForCausalLM};
use crate::worker::cache_engine::CacheEngine;
use crate::worker::step_message::{encode_cache_ops, encode_execute, encode_shutdown};

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
}

/// Where one sequence's rows sit in the step's logits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogitsRows {
    /// Rows scoring prompt tokens: row `first + i` holds the logits at position
    /// `positions.start + i`, which score the prompt token after it.
    pub prompt: Option<(usize, Range<usize>)>,
    /// The row to sample the next token from, when the step reaches the sequence's end.
    pub sample: Option<usize>,
}

/// The model, its KV cache and the buffers reused from step to step. On rank 0 of a
/// tensor-parallel group (the driver) it also tells the other ranks' workers what to do,
/// before doing it itself (`worker/worker_loop.rs`).
pub struct ModelRunner {
    model: LlamaForCausalLM,
    cache: CacheEngine,
    buffers: ForwardBuffers,
    input: InputMetadata,
    /// Scratch for one sequence's block tables as the kernels index them.
    table: Vec<u32>,
    /// The group, when this runner drives other ranks.
    workers: Option<Arc<dyn Communicator>>,
    /// The step message for the workers, reused.
    message: Vec<u8>,
    /// How many logits the last forward pass gave.
    num_logits: usize,
    /// Scratch for the rows to sample from while a batch is laid out, and their count.
    sample_rows: Vec<usize>,
    num_samples: usize,
}

impl ModelRunner {
    /// The runner of `model`'s rank: the driver when that is rank 0.
    pub fn new(model: LlamaForCausalLM, cache: CacheEngine) -> Self {
        let comm = model.communicator();
        let workers = (comm.rank() == 0 && comm.world_size() > 1).then(|| Arc::clone(comm));
        let input = InputMetadata::with_groups(cache.layout().num_groups());
        Self {
            model,
            cache,
            buffers: ForwardBuffers::default(),
            input,
            table: Vec::new(),
            workers,
            message: Vec::new(),
            num_logits: 0,
            sample_rows: Vec::new(),
            num_samples: 0,
        }
    }

    pub fn model(&self) -> &LlamaForCausalLM {
        &self.model
    }

    pub fn cache(&self) -> &CacheEngine {
        &self.cache
    }

    /// Moves KV blocks to and from the swap pool as the scheduler ordered: swap-outs first,
    /// since a block swapped out may be a swap-in's destination.
    pub fn execute_cache_ops(
        &mut self,
        swap_out: &[(BlockId, CpuBlockId)],
        swap_in: &[(CpuBlockId, BlockId)],
    ) -> Result<(), InputError> {
        if swap_out.is_empty() && swap_in.is_empty() {
            return Ok(());
        }
        if let Some(workers) = &self.workers {
            encode_cache_ops(&mut self.message, swap_out, swap_in);
            workers.broadcast_bytes(0, &mut self.message)?;
        }
        self.apply_cache_ops(swap_out, swap_in);
        Ok(())
    }

    /// This rank's part of `execute_cache_ops`.
    pub(super) fn apply_cache_ops(
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

    /// Lays the sequences out as one flat batch (prompt chunks and decodes alike: vLLM's
    /// `prepare_prefill` and `prepare_decode` in one pass) and says where each one's logits
    /// will be, in `rows` (cleared first, one entry per sequence).
    pub fn prepare_input<'a>(
        &mut self,
        seqs: impl IntoIterator<Item = SeqInput<'a>>,
        rows: &mut Vec<LogitsRows>,
    ) {
        let block_size = self.cache.block_size();
        self.input.clear();
        rows.clear();
        self.sample_rows.clear();
        for s in seqs {
            let end = s.num_computed + s.num_new;
            self.table.clear();
            self.table
                .extend(s.block_tables.iter().flatten().map(|b| b.0));
            let start_row = self.input.num_tokens();
            let new_tokens = &s.token_ids[s.num_computed..end];
            self.input
                .add_sequence(new_tokens, end, &self.table, block_size, false);
            let mut r = LogitsRows::default();
            if let Some(from) = s.prompt_logprobs_from {
                // The last prompt position scores the first output token, not a prompt one.
                let positions = s.num_computed.max(from)..end.min(s.prompt_len - 1);
                if !positions.is_empty() {
                    r.prompt = Some((self.input.logits_indices.len(), positions.clone()));
                    let rows = positions.map(|pos| start_row + pos - s.num_computed);
                    self.input.logits_indices.extend(rows);
                }
            }
            if end == s.token_ids.len() {
                r.sample = Some(self.sample_rows.len());
                self.sample_rows.push(start_row + s.num_new - 1);
            }
            rows.push(r);
        }
        // The rows to sample from go last, together, in sequence order: the sampler then
        // works on them where the model wrote them (`sample_logits_mut`), with no copy.
        let first_sample = self.input.logits_indices.len();
        for r in rows.iter_mut() {
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
        if let Some(workers) = &self.workers {
            encode_execute(&mut self.message, &self.input);
            workers.broadcast_bytes(0, &mut self.message)?;
        }
        self.num_logits = self.forward(None)?.len();
        Ok(self.logits())
    }

    /// Logits `[rows asked for by prepare_input, vocab_size]` of the last batch run.
    pub fn logits(&self) -> &[f32] {
        self.buffers.logits(self.num_logits)
    }

    /// The last batch's rows to sample from (the `LogitsRows::sample` rows, in sequence
    /// order, at the end of [`logits`](Self::logits)), for the sampler to change in place.
    pub fn sample_logits_mut(&mut self) -> &mut [f32] {
        let vocab = self.model.config().vocab_size;
        let all = self.buffers.logits_mut(self.num_logits);
        let from = all.len() - self.num_samples * vocab;
        &mut all[from..]
    }

    /// Frees step buffers that a large batch left grown (see
    /// `ForwardBuffers::release_if_large`); for when no request is running.
    pub fn release_idle_memory(&mut self) {
        self.buffers.release_if_large();
    }

    /// Runs the model on `input`, or on the batch `prepare_input` laid out.
    pub(super) fn forward(&mut self, input: Option<&InputMetadata>) -> Result<&[f32], InputError> {
        let block_size = self.cache.block_size();
        let (model, cache, buffers) = (&self.model, &mut self.cache, &mut self.buffers);
        let input = input.unwrap_or(&self.input);
        minivllm_kernels::threading::install(|| {
            model.forward(input, cache.layers_mut(), block_size, buffers)
        })
    }
}

/// The driver's last word to its workers: they leave their loops (and MPI is finalised once
/// every rank drops its group).
impl Drop for ModelRunner {
    fn drop(&mut self) {
        if let Some(workers) = &self.workers {
            encode_shutdown(&mut self.message);
            if let Err(e) = workers.broadcast_bytes(0, &mut self.message) {
                tracing::warn!("could not tell the tensor-parallel workers to stop: {e}");
            }
        }
    }
}
