//! A draft model as the proposer (vLLM's `draft_model` method): a smaller model of the same
//! vocabulary, on its own KV cache, guesses the next tokens greedily; the target verifies
//! them (`worker/model_runner.rs`), so the output is the target's whatever the draft says.
//!
//! Each sequence's draft state is how many of its tokens the draft has computed K/V for and
//! the guesses it fed after them. When the sequence comes back, the guesses the target kept
//! are still right, so the draft goes on from there: it feeds the tokens it has not seen
//! (the whole prompt the first time, then the token the target sampled after the kept
//! guesses) in one pass, then one pass per further guess. K/V of rejected guesses is
//! written over, as in the target's cache. The draft runs on rank 0 only, unsharded.
//!
//! A small model's LM head is a large share of what its step reads (Qwen2.5-0.5B: 146 of
//! 393 MB, for 152k tokens), and a guess only needs the draft's likeliest token, which is
//! almost always a common one or one the sequence already holds. So the draft's head keeps
//! the first [`COMMON_TOKENS`] rows (BPE and SentencePiece vocabularies number tokens
//! roughly by frequency, as FR-Spec observes) plus, per sequence, the rows of rarer tokens
//! in its prompt and output. (On the script edit every token of the answer is in that set;
//! on a story 99 %.) A guess this head cannot make is a wrong guess, never a wrong output.

use std::collections::HashMap;

use minivllm_kernels::attention::KvCacheDtype;
use minivllm_kernels::threading;

use crate::config::DraftModelConfig;
use crate::ids::{BlockId, SeqId, TokenId};
use crate::model_executor::layers::linear::WeightMatrix;
use crate::model_executor::layers::sampler::argmax;
use crate::model_executor::loader::weights::LoadOptions;
use crate::model_executor::model_loader::load_model;
use crate::worker::cache_engine::CacheEngine;
use crate::worker::draft_proposer::DraftProposer;
use crate::worker::model_runner::{LogitsRows, ModelRunner, SeqInput};
use crate::worker::worker_config::WorkerError;

/// Rows of the draft's head every sequence gets: the vocabulary's first tokens.
pub const COMMON_TOKENS: usize = 32768;

pub(crate) struct DraftModelProposer {
    runner: ModelRunner,
    /// The head's rows of the first [`COMMON_TOKENS`] tokens; `None` when the vocabulary is
    /// no larger (the model's own head is used).
    common_head: Option<WeightMatrix>,
    /// Reused: logits over the common rows and over a sequence's rare ones.
    common_logits: Vec<f32>,
    rare_logits: Vec<f32>,
    max_draft_len: usize,
    max_model_len: usize,
    /// Blocks of the draft's cache no sequence holds.
    free: Vec<BlockId>,
    seqs: HashMap<SeqId, DraftSeq>,
    /// Reused: the sequence's tokens and the guesses so far; the runner's logits rows.
    tokens: Vec<TokenId>,
    rows: Vec<LogitsRows>,
}

#[derive(Default)]
struct DraftSeq {
    /// One block table (the draft has one KV cache group).
    blocks: Vec<Vec<BlockId>>,
    /// Tokens whose K/V the draft holds, all of them the sequence's.
    computed: usize,
    /// Guesses fed after those, which the target may have rejected.
    fed: Vec<TokenId>,
    /// The sequence's tokens beyond the common ones (sorted), their head rows, and how
    /// many of its tokens have been looked through for them.
    rare: Vec<TokenId>,
    rare_head: Option<WeightMatrix>,
    scanned: usize,
}

impl DraftSeq {
    /// Adds the rare tokens among `tokens[scanned..]`, and their rows to its head.
    fn note_rare_tokens(&mut self, tokens: &[TokenId], head: &WeightMatrix) {
        let before = self.rare.len();
        for &t in tokens.get(self.scanned..).unwrap_or_default() {
            if t as usize >= COMMON_TOKENS {
                if let Err(at) = self.rare.binary_search(&t) {
                    self.rare.insert(at, t);
                }
            }
        }
        self.scanned = tokens.len();
        if self.rare.len() != before {
            let rows: Vec<usize> = self.rare.iter().map(|&t| t as usize).collect();
            self.rare_head = head.select_rows(&rows);
        }
    }
}

impl DraftModelProposer {
    /// Loads the draft `config` names, with a KV cache of `num_blocks` blocks (as many
    /// positions as the target's) for sequences of up to `max_model_len` tokens.
    pub fn load(
        config: &DraftModelConfig,
        load: &LoadOptions,
        max_model_len: usize,
        block_size: usize,
        num_blocks: usize,
        kv_cache_dtype: KvCacheDtype,
    ) -> Result<Self, WorkerError> {
        let mut model = load_model(&config.model, load)?.model;
        if model.config().linear_attention.is_some() {
            // Its cache would need a state slot per sequence, and rejected guesses taken
            // back out of the state.
            return Err(WorkerError::Config(format!(
                "the draft model {} has linear-attention layers (Qwen3.5): not supported \
                 as a draft model",
                config.model
            )));
        }
        let context = model.config().max_position_embeddings;
        if context < max_model_len {
            return Err(WorkerError::Config(format!(
                "the draft model {} has a context of {context} tokens, less than the target's \
                 max_model_len {max_model_len}: lower --max-model-len",
                config.model
            )));
        }
        model.set_max_model_len(max_model_len);
        let cache =
            CacheEngine::with_dtype(model.local_config(), block_size, num_blocks, kv_cache_dtype);
        if cache.layout().num_groups() != 1 {
            return Err(WorkerError::Config(format!(
                "the draft model {} has sliding-window layers, which drafting does not support \
                 yet",
                config.model
            )));
        }
        let free = (0..cache.num_blocks() as u32).rev().map(BlockId).collect();
        let head = model.lm_head();
        let common_head = (head.rows() > COMMON_TOKENS)
            .then(|| head.select_rows(&(0..COMMON_TOKENS).collect::<Vec<_>>()))
            .flatten();
        Ok(Self {
            runner: ModelRunner::new(model, cache),
            common_head,
            common_logits: Vec::new(),
            rare_logits: Vec::new(),
            max_draft_len: config.num_speculative_tokens,
            max_model_len,
            free,
            seqs: HashMap::new(),
            tokens: Vec::new(),
            rows: Vec::new(),
        })
    }

    /// The draft's vocabulary size, for the check against the target's.
    pub fn vocab_size(&self) -> usize {
        self.runner.model().config().vocab_size
    }

    /// Runs the draft on `tokens[computed..]` and returns its greedy next token.
    fn next_token(&mut self, state: &DraftSeq, computed: usize) -> Option<TokenId> {
        let blocks = &state.blocks;
        let input = SeqInput {
            token_ids: &self.tokens,
            prompt_len: self.tokens.len(),
            num_computed: computed,
            num_new: self.tokens.len() - computed,
            block_tables: blocks,
            prompt_logprobs_from: None,
            state: None,
        };
        self.runner.prepare_input([input], &mut self.rows);
        let Some(common) = &self.common_head else {
            return match self.runner.execute_model() {
                Ok(logits) => Some(argmax(logits) as TokenId),
                Err(e) => refused(e),
            };
        };
        let hidden = match self.runner.execute_hidden() {
            Ok(h) => h,
            Err(e) => return refused(e),
        };
        let (common_logits, rare_logits) = (&mut self.common_logits, &mut self.rare_logits);
        threading::install(|| {
            common_logits.resize(common.rows(), 0.0);
            common.matmul(hidden, common_logits, 1);
            let best = argmax(common_logits);
            let Some(rare) = &state.rare_head else {
                return Some(best as TokenId);
            };
            rare_logits.resize(rare.rows(), 0.0);
            rare.matmul(hidden, rare_logits, 1);
            let r = argmax(rare_logits);
            Some(if rare_logits[r] > common_logits[best] {
                state.rare[r]
            } else {
                best as TokenId
            })
        })
    }
}

fn refused(e: impl std::fmt::Display) -> Option<TokenId> {
    tracing::warn!(error = %e, "the draft model refused a batch; no guesses");
    None
}

impl DraftProposer for DraftModelProposer {
    fn propose(&mut self, seq: SeqId, token_ids: &[TokenId], max_len: usize) -> Vec<TokenId> {
        let len = token_ids.len();
        // The last guess's K/V is never needed: positions up to len + k - 2 are written.
        let k = max_len
            .min(self.max_draft_len)
            .min(self.max_model_len.saturating_sub(len));
        if k == 0 {
            return Vec::new();
        }
        let mut state = self.seqs.remove(&seq).unwrap_or_default();
        if self.common_head.is_some() {
            state.note_rare_tokens(token_ids, self.runner.model().lm_head());
        }
        let kept = (state.fed.iter())
            .zip(token_ids.get(state.computed..).unwrap_or_default())
            .take_while(|(a, b)| a == b)
            .count();
        state.computed = (state.computed + kept).min(len - 1);
        state.fed.clear();
        let blocks_needed = (len + k - 1).div_ceil(self.runner.cache().block_size());
        state.blocks.resize_with(1, Vec::new);
        let more = blocks_needed.saturating_sub(state.blocks[0].len());
        if more > self.free.len() {
            // The draft's cache is full: no guesses this time (the target goes on alone).
            self.seqs.insert(seq, state);
            return Vec::new();
        }
        let at = self.free.len() - more;
        state.blocks[0].extend(self.free.drain(at..));
        self.tokens.clear();
        self.tokens.extend_from_slice(token_ids);
        let mut guesses = Vec::with_capacity(k);
        let mut computed = state.computed;
        while guesses.len() < k {
            let Some(t) = self.next_token(&state, computed) else {
                break;
            };
            computed = self.tokens.len();
            guesses.push(t);
            self.tokens.push(t);
        }
        state.computed = len.min(computed);
        // Every guess but the last was fed, its K/V written after the sequence's tokens.
        state
            .fed
            .extend(guesses.iter().take(guesses.len().saturating_sub(1)));
        self.seqs.insert(seq, state);
        guesses
    }

    fn max_draft_len(&self) -> usize {
        self.max_draft_len
    }

    fn forget(&mut self, seqs: &[SeqId]) {
        for id in seqs {
            if let Some(state) = self.seqs.remove(id) {
                self.free.extend(state.blocks.into_iter().flatten());
            }
        }
    }
}
