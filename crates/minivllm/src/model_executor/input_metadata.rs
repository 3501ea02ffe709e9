//! What one forward pass needs to know about its flat batch of tokens.
//!
//! A step mixes prompt chunks and decode tokens from many sequences; the model sees only
//! this description: which tokens, at which positions, where their K/V go (slot mapping),
//! where each sequence's context lives (block tables), and which positions need logits.

use minivllm_kernels::attention::SeqAttn;

/// One sequence's slice of the flat batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSlice {
    /// Index of its first new token in the flat batch.
    pub query_start: usize,
    /// Number of new tokens this step.
    pub query_len: usize,
    /// Tokens in the cache once this step's are written.
    pub context_len: usize,
    /// Range of `InputMetadata::block_tables` holding this sequence's block ids.
    pub blocks_start: usize,
    pub num_blocks: usize,
}

/// The flat batch of one forward pass. Buffers are reused between steps: [`clear`](Self::clear)
/// keeps their capacity.
#[derive(Debug, Clone, Default)]
pub struct InputMetadata {
    pub token_ids: Vec<u32>,
    pub positions: Vec<usize>,
    /// KV-cache slot (block id * block size + offset) of every new token.
    pub slot_mapping: Vec<usize>,
    pub seqs: Vec<SeqSlice>,
    /// All sequences' block tables, back to back.
    pub block_tables: Vec<u32>,
    /// Flat-batch indices of the tokens whose logits are wanted, in output order.
    pub logits_indices: Vec<usize>,
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

impl InputMetadata {
    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.seqs.clear();
        self.block_tables.clear();
        self.logits_indices.clear();
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Appends one sequence's new tokens. `block_table` must cover `context_len` tokens;
    /// positions run `context_len - tokens.len() .. context_len`. When `want_logits`, the
    /// sequence's last new token's logits are produced.
    pub fn add_sequence(
        &mut self,
        tokens: &[u32],
        context_len: usize,
        block_table: &[u32],
        block_size: usize,
        want_logits: bool,
    ) {
        let query_start = self.token_ids.len();
        let first_pos = context_len - tokens.len();
        self.seqs.push(SeqSlice {
            query_start,
            query_len: tokens.len(),
            context_len,
            blocks_start: self.block_tables.len(),
            num_blocks: block_table.len(),
        });
        self.block_tables.extend_from_slice(block_table);
        self.token_ids.extend_from_slice(tokens);
        for pos in first_pos..context_len {
            self.positions.push(pos);
            let block = block_table[pos / block_size] as usize;
            self.slot_mapping
                .push(block * block_size + pos % block_size);
        }
        if want_logits && !tokens.is_empty() {
            self.logits_indices.push(query_start + tokens.len() - 1);
        }
    }

    /// The attention kernel's view of sequence `i`.
    pub fn seq_attn(&self, i: usize) -> SeqAttn<'_> {
        let s = &self.seqs[i];
        SeqAttn {
            query_start: s.query_start,
            query_len: s.query_len,
            context_len: s.context_len,
            block_table: &self.block_tables[s.blocks_start..s.blocks_start + s.num_blocks],
        }
    }

    /// Checks internal consistency against the cache's geometry, so a bad schedule is an
    /// error rather than an out-of-bounds write into another sequence's KV.
    pub fn validate(
        &self,
        block_size: usize,
        num_blocks: usize,
        vocab_size: usize,
    ) -> Result<(), InputError> {
        let n = self.token_ids.len();
        if self.positions.len() != n || self.slot_mapping.len() != n {
            return Err(InputError::BadBatch(format!(
                "{n} tokens but {} positions and {} slots",
                self.positions.len(),
                self.slot_mapping.len()
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
            let table = &self.block_tables[s.blocks_start..s.blocks_start + s.num_blocks];
            if let Some(b) = table.iter().find(|&&b| b as usize >= num_blocks) {
                return Err(bad(format!(
                    "block {b} outside the cache ({num_blocks} blocks)"
                )));
            }
        }
        if next != n {
            return Err(InputError::BadBatch(format!(
                "sequences cover {next} of {n} tokens"
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
