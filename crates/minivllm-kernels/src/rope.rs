//! Rotary position embedding, GPT-NeoX style (rotate-half), as Hugging Face LLaMA applies it.

/// Rotates the first `rot_dim` dims of every head of `x` (`[num_tokens, num_heads, head_dim]`)
/// in place. `cos_sin_cache` is `[max_position, rot_dim]`: for each position, `rot_dim / 2`
/// cosines followed by `rot_dim / 2` sines (vLLM's layout). `positions[t]` is token t's position.
pub fn rotary_embedding_neox(
    _positions: &[usize],
    _x: &mut [f32],
    _num_heads: usize,
    _head_dim: usize,
    _rot_dim: usize,
    _cos_sin_cache: &[f32],
) {
    unimplemented!("kernels helper")
}
