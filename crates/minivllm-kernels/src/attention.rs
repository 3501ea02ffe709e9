//! Paged attention over a block-structured KV cache.

/// Shapes shared by the attention kernels of one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// One sequence's part of a flat batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqAttn<'a> {
    /// Index of this sequence's first new token in the flat batch.
    pub query_start: usize,
    /// Number of new tokens (prompt chunk length, or 1 for a decode).
    pub query_len: usize,
    /// Tokens in the cache once the new ones are written (cached prefix + new).
    /// New token `i` sits at position `context_len - query_len + i` and attends to
    /// positions `0..=that` (causal within the new tokens, full over the prefix).
    pub context_len: usize,
    /// Physical block ids holding positions `0..context_len`, in order.
    pub block_table: &'a [u32],
}

/// Writes each new token's key and value (`[num_tokens, num_kv_heads, head_dim]`) into the
/// caches at `slot_mapping[t]` (slot = block_id * block_size + offset).
pub fn reshape_and_cache(
    _key: &[f32],
    _value: &[f32],
    _key_cache: &mut [f32],
    _value_cache: &mut [f32],
    _slot_mapping: &[usize],
    _shape: &AttnShape,
) {
    unimplemented!("kernels helper")
}

/// `out[t, h, :]` = attention of query `[t, h, :]` over its sequence's cached keys/values,
/// with GQA (query head h reads kv head `h / (num_heads / num_kv_heads)`).
pub fn paged_attention(
    _out: &mut [f32],
    _query: &[f32],
    _key_cache: &[f32],
    _value_cache: &[f32],
    _seqs: &[SeqAttn<'_>],
    _shape: &AttnShape,
) {
    unimplemented!("kernels helper")
}
