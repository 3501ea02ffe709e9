//! What one step runs, as the scheduler hands it to the executor (vLLM v1's
//! `SchedulerOutput`): which sequences run, how many of their tokens, where their K/V live.
//!
//! The sequences themselves (tokens, settings) stay the scheduler's one record of them
//! (`sequence::Sequences`), which the executor reads beside this; the worker keeps only what
//! is its own per sequence (its RNG, pooling sums: `worker/input_batch.rs`), made when a
//! sequence is new to it and dropped when it finishes.

use crate::distributed::kv_transfer::KvPayload;
use crate::ids::{BlockId, CpuBlockId, SeqId, TokenId};
use crate::model_executor::input_metadata::StateStep;
use crate::structured_output::TokenBitmask;
use std::ops::Range;
use std::sync::Arc;

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub id: SeqId,
    /// Tokens already in the cache; this step feeds `token_ids[num_computed..num_computed + num_new_tokens]`.
    pub num_computed: usize,
    pub num_new_tokens: usize,
    /// Its block tables, one per KV cache group, one after another, in
    /// [`SchedulerOutput::block_ids`].
    pub block_ids: Range<usize>,
    /// Its linear-attention state slot and the copies prefix caching makes of it, for a
    /// model with such layers.
    pub state: Option<StateStep>,
    /// Draft tokens to verify (speculative decoding): fed after the sequence's last token
    /// and counted in `num_new_tokens`; the worker samples at each of their positions and
    /// keeps them while they match what it samples.
    pub spec_token_ids: Vec<TokenId>,
    /// How many tokens the draft proposer should guess after the token this step samples
    /// for it (0: none), as the scheduler judged worth verifying next step.
    pub num_lookahead: usize,
    /// The worker samples its next token this step: the scheduler's one decision
    /// ([`reaches_end`], and not an embedding request), which the grammar masks, the
    /// runner's sample rows and the outputs follow.
    pub samples: bool,
}

/// Whether a step that computes a sequence's tokens up to `num_computed + num_new` reaches
/// the end of its `len` known ones (draft tokens counted in both), so that its last
/// position's logits give the next token: a prompt chunk short of the end samples nothing.
pub(crate) fn reaches_end(num_computed: usize, num_new: usize, len: usize) -> bool {
    num_computed + num_new >= len
}

/// A payload's blocks `blocks` (indices into the sequence's table and the payload alike)
/// for the scheduled sequence `seq`: those past its prefix-cache hits.
#[derive(Debug, Clone)]
pub struct KvImport {
    pub seq: SeqId,
    pub payload: Arc<KvPayload>,
    pub blocks: Range<usize>,
}

/// A finished prefill's prompt KV for a decode server: the blocks it was in when it
/// finished (read before the next step can reuse them). Its prompt is the sequence's
/// record's, readable until the engine takes the ended sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvExport {
    pub seq: SeqId,
    pub blocks: Vec<BlockId>,
}

#[derive(Debug, Default)]
pub struct SchedulerOutput {
    pub scheduled: Vec<ScheduledSeq>,
    /// The scheduled sequences new to the worker (first scheduled, or rescheduled after it
    /// forgot them), in `scheduled`'s order.
    pub new_seqs: Vec<SeqId>,
    /// Sequences that finished or were aborted since the last step: the worker forgets them.
    pub finished: Vec<SeqId>,
    /// The tokens each grammar-constrained sequence that samples this step may sample.
    pub token_masks: Vec<(SeqId, TokenBitmask)>,
    /// The block tables of `scheduled` (each one's `block_ids` range), as the kernels index
    /// them.
    pub block_ids: Vec<u32>,
    /// KV blocks to copy into the swap pool before anything else, from sequences swapped
    /// out this step: their GPU blocks may already be handed to others in this same step.
    pub swap_out: Vec<(BlockId, CpuBlockId)>,
    /// KV blocks to copy back from the swap pool, after `swap_out`.
    pub swap_in: Vec<(CpuBlockId, BlockId)>,
    /// Sequences preempted this step, swapped out or to be recomputed.
    pub preempted: Vec<SeqId>,
    /// Prompt KV pulled from a prefill server, to write into blocks of sequences admitted
    /// this step before their first tokens run.
    pub kv_imports: Vec<KvImport>,
    pub num_batched_tokens: usize,
}

impl SchedulerOutput {
    /// Runs no sequence (it may still move blocks or forget sequences).
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }

    /// The mask of `seq`'s next token, if a grammar constrains it.
    pub fn token_mask(&self, seq: SeqId) -> Option<&TokenBitmask> {
        self.token_masks
            .iter()
            .find(|(id, _)| *id == seq)
            .map(|(_, m)| m)
    }

    /// `seq`'s block tables, flattened over its KV cache groups.
    pub(crate) fn block_ids(&self, seq: &ScheduledSeq) -> &[u32] {
        &self.block_ids[seq.block_ids.clone()]
    }
}
