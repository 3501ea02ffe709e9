//! What one forward pass needs to know about its flat batch of tokens.
//!
//! A step mixes prompt chunks and decode tokens from many sequences; the model sees only
//! this description: which tokens, at which positions, where their K/V go (slot mapping),
//! where each sequence's context lives (block tables), and which positions need logits.

use minivllm_kernels::attention::SeqAttn;

use crate::config::first_needed_block;
use crate::ids::BlockId;

/// One sequence's slice of the flat batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSlice {
    /// Index of its first new token in the flat batch.
    pub query_start: usize,
    /// Number of new tokens this step.
    pub query_len: usize,
    /// Tokens in the cache once this step's are written.
    pub context_len: usize,
    /// Where this sequence's block tables start in `InputMetadata::block_tables`: one per
    /// KV cache group, back to back.
    pub blocks_start: usize,
    /// Blocks in each of its tables.
    pub num_blocks: usize,
}

/// What one sequence's step does with its linear-attention state (for a model with such
/// layers): the slot its state lives in, and the copies prefix caching makes of it (vLLM's
/// Mamba states in the hybrid cache, "align" mode): a prefix hit's cached state taken in
/// before the step, and the state at a block boundary inside the step kept for later hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateStep {
    pub slot: u32,
    /// A cached state, that of the step's first position, copied into `slot` first.
    pub restore_from: Option<u32>,
    /// `(after, into)`: the state after the step's first `after` tokens (a block boundary)
    /// is copied into slot `into`.
    pub snapshot: Option<(u32, u32)>,
}

impl StateStep {
    /// The state carried on in `slot` (or started there, at position 0), with no copy.
    pub fn in_slot(slot: u32) -> Self {
        Self {
            slot,
            restore_from: None,
            snapshot: None,
        }
    }

    /// The slots it reads or writes.
    pub(crate) fn slots(&self) -> impl Iterator<Item = u32> {
        let snapshot = self.snapshot.map(|(_, into)| into);
        [Some(self.slot), self.restore_from, snapshot]
            .into_iter()
            .flatten()
    }
}

/// The flat batch of one forward pass. Buffers are reused between steps: [`clear`](Self::clear)
/// keeps their capacity.
#[derive(Debug, Clone)]
pub struct InputMetadata {
    pub token_ids: Vec<u32>,
    pub positions: Vec<usize>,
    /// Per KV cache group (`config/kv_cache_layout.rs`), the slot (block id * block size +
    /// offset) of every new token.
    pub slot_mapping: Vec<Vec<usize>>,
    pub seqs: Vec<SeqSlice>,
    /// All sequences' block tables, back to back: each sequence's table of every group.
    /// A sliding-window group's table holds [`BlockId::NULL`] for blocks behind the window.
    pub block_tables: Vec<u32>,
    /// Flat-batch indices of the tokens whose logits are wanted, in output order.
    pub logits_indices: Vec<usize>,
    /// Each sequence's state slot and copies, for a model with linear-attention layers
    /// (empty for others): where its recurrent state lives in every such layer.
    pub states: Vec<StateStep>,
}

/// Why a batch description is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputError {
    #[error("sequence {seq}: {reason}")]
    BadSequence { seq: usize, reason: String },
    #[error("batch: {0}")]
    BadBatch(String),
    /// A tensor-parallel collective failed: another rank is gone or out of step.
    #[error(transparent)]
    Collective(#[from] crate::distributed::CommError),
}

impl Default for InputMetadata {
    /// For a cache of one group.
    fn default() -> Self {
        Self::with_groups(1)
    }
}

impl InputMetadata {
    /// An empty batch over a cache of `num_groups` KV cache groups.
    pub fn with_groups(num_groups: usize) -> Self {
        Self {
            token_ids: Vec::new(),
            positions: Vec::new(),
            slot_mapping: vec![Vec::new(); num_groups.max(1)],
            seqs: Vec::new(),
            block_tables: Vec::new(),
            logits_indices: Vec::new(),
            states: Vec::new(),
        }
    }

    pub fn num_groups(&self) -> usize {
        self.slot_mapping.len()
    }

    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.iter_mut().for_each(Vec::clear);
        self.seqs.clear();
        self.block_tables.clear();
        self.logits_indices.clear();
        self.states.clear();
    }

    pub(crate) fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Appends one sequence's new tokens. `block_tables` holds its table of every group,
    /// back to back, of equal lengths covering `context_len` tokens; positions run
    /// `context_len - tokens.len() .. context_len`. When `want_logits`, the sequence's last
    /// new token's logits are produced.
    pub fn add_sequence(
        &mut self,
        tokens: &[u32],
        context_len: usize,
        block_tables: &[u32],
        block_size: usize,
        want_logits: bool,
    ) {
        let query_start = self.token_ids.len();
        let first_pos = context_len - tokens.len();
        let num_blocks = block_tables.len() / self.num_groups();
        self.seqs.push(SeqSlice {
            query_start,
            query_len: tokens.len(),
            context_len,
            blocks_start: self.block_tables.len(),
            num_blocks,
        });
        self.block_tables.extend_from_slice(block_tables);
        self.token_ids.extend_from_slice(tokens);
        self.positions.extend(first_pos..context_len);
        for (table, slots) in block_tables
            .chunks_exact(num_blocks.max(1))
            .zip(&mut self.slot_mapping)
        {
            for pos in first_pos..context_len {
                // A block left behind a window is never written: new tokens are in it.
                let block = table
                    .get(pos / block_size)
                    .map_or(usize::MAX, |&b| b as usize);
                slots.push(block.wrapping_mul(block_size) + pos % block_size);
            }
        }
        if want_logits && !tokens.is_empty() {
            self.logits_indices.push(query_start + tokens.len() - 1);
        }
    }

    /// Sequence `i`'s block table of group `group`.
    pub(crate) fn block_table(&self, i: usize, group: usize) -> &[u32] {
        let s = &self.seqs[i];
        let start = s.blocks_start + group * s.num_blocks;
        &self.block_tables[start..start + s.num_blocks]
    }

    /// The attention kernel's view of sequence `i` in the layers of group `group`.
    pub(crate) fn seq_attn(&self, i: usize, group: usize) -> SeqAttn<'_> {
        let s = &self.seqs[i];
        SeqAttn {
            query_start: s.query_start,
            query_len: s.query_len,
            context_len: s.context_len,
            block_table: self.block_table(i, group),
        }
    }

    /// Checks internal consistency against the cache's geometry (`group_windows`: each KV
    /// cache group's sliding window), so a bad schedule is an error rather than an
    /// out-of-bounds write into another sequence's KV.
    pub fn validate(
        &self,
        block_size: usize,
        num_blocks: usize,
        vocab_size: usize,
        group_windows: &[Option<usize>],
    ) -> Result<(), InputError> {
        let n = self.token_ids.len();
        if group_windows.len() != self.num_groups() {
            return Err(InputError::BadBatch(format!(
                "block tables for {} KV cache groups, the cache has {}",
                self.num_groups(),
                group_windows.len()
            )));
        }
        if let Some(slots) = self.slot_mapping.iter().find(|s| s.len() != n) {
            return Err(InputError::BadBatch(format!(
                "{n} tokens but {} slots",
                slots.len()
            )));
        }
        if self.positions.len() != n {
            return Err(InputError::BadBatch(format!(
                "{n} tokens but {} positions",
                self.positions.len(),
            )));
        }
        if let Some(t) = self.token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(InputError::BadBatch(format!(
                "token id {t} is outside the vocabulary (size {vocab_size})"
            )));
        }
        let mut next = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            let bad = |reason: String| InputError::BadSequence { seq: i, reason };
            if s.query_start != next || s.query_len == 0 {
                return Err(bad("query ranges must be non-empty and back to back".into()));
            }
            next += s.query_len;
            if s.context_len < s.query_len {
                return Err(bad("context shorter than its new tokens".into()));
            }
            if s.num_blocks * block_size < s.context_len {
                return Err(bad(format!(
                    "{} blocks cannot hold {} tokens",
                    s.num_blocks, s.context_len
                )));
            }
            if s.blocks_start + s.num_blocks * group_windows.len() > self.block_tables.len() {
                return Err(bad("block tables past the batch's".into()));
            }
            for (g, &w) in group_windows.iter().enumerate() {
                // Only blocks some query reads must be there: in a sliding-window group the
                // ones behind the first query's window may be gone.
                let first = first_needed_block(w, s.context_len - s.query_len, block_size);
                let outside = |&(j, &b): &(usize, &u32)| {
                    b as usize >= num_blocks && (j >= first || b != BlockId::NULL.0)
                };
                if let Some((_, b)) = self.block_table(i, g).iter().enumerate().find(outside) {
                    return Err(bad(format!(
                        "block {b} outside the cache ({num_blocks} blocks)"
                    )));
                }
            }
        }
        if next != n {
            return Err(InputError::BadBatch(format!(
                "sequences cover {next} of {n} tokens"
            )));
        }
        if !self.states.is_empty() && self.states.len() != self.seqs.len() {
            return Err(InputError::BadBatch(format!(
                "{} state slots for {} sequences",
                self.states.len(),
                self.seqs.len()
            )));
        }
        if let Some(i) = self.logits_indices.iter().find(|&&i| i >= n) {
            return Err(InputError::BadBatch(format!(
                "logits index {i} past the batch"
            )));
        }
        Ok(())
    }
}
