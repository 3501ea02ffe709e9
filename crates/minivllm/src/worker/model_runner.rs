//! Prepares one batch's inputs from the scheduled sequences and runs the model on them over
//! the KV cache.

use std::ops::Range;

use crate::ids::{BlockId, CpuBlockId, TokenId};
use crate::model_executor::input_metadata::{InputError, InputMetadata};
use crate::model_executor::models::llama::{ForwardBuffers, LlamaForCausalLM};
use crate::worker::cache_engine::CacheEngine;

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
    pub block_table: &'a [BlockId],
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

/// The model, its KV cache and the buffers reused from step to step.
pub struct ModelRunner {
    model: LlamaForCausalLM,
    cache: CacheEngine,
    buffers: ForwardBuffers,
    input: InputMetadata,
    /// Scratch for one block table as the kernels index it.
    table: Vec<u32>,
}

impl ModelRunner {
    pub fn new(model: LlamaForCausalLM, cache: CacheEngine) -> Self {
        Self {
            model,
            cache,
            buffers: ForwardBuffers::default(),
            input: InputMetadata::default(),
            table: Vec::new(),
        }
    }

    pub fn model(&self) -> &LlamaForCausalLM {
        &self.model
    }

    pub fn cache(&self) -> &CacheEngine {
        &self.cache
    }

    pub fn copy_blocks(&mut self, pairs: &[(BlockId, BlockId)]) {
        if !pairs.is_empty() {
            self.cache.copy_blocks(pairs);
        }
    }

    pub fn swap_out(&mut self, pairs: &[(BlockId, CpuBlockId)]) {
        if !pairs.is_empty() {
            self.cache.swap_out(pairs);
        }
    }

    pub fn swap_in(&mut self, pairs: &[(CpuBlockId, BlockId)]) {
        if !pairs.is_empty() {
            self.cache.swap_in(pairs);
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
        for s in seqs {
            let end = s.num_computed + s.num_new;
            self.table.clear();
            self.table.extend(s.block_table.iter().map(|b| b.0));
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
                r.sample = Some(self.input.logits_indices.len());
                self.input.logits_indices.push(start_row + s.num_new - 1);
            }
            rows.push(r);
        }
    }

    /// Logits `[rows asked for by prepare_input, vocab_size]` for the prepared batch.
    pub fn execute_model(&mut self) -> Result<&[f32], InputError> {
        let block_size = self.cache.block_size();
        let (model, cache, buffers) = (&self.model, &mut self.cache, &mut self.buffers);
        let input = &self.input;
        minivllm_kernels::threading::install(|| {
            model.forward(input, cache.layers_mut(), block_size, buffers)
        })
    }
}
