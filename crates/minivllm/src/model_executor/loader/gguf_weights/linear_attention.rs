//! Qwen3.5's Gated DeltaNet layers in a GGUF file's `<arch>.ssm.*` keys.

use crate::config::LinearAttentionConfig;
use crate::model_executor::loader::gguf::{GgufFile, GgufValue};
use crate::model_executor::loader::LoadError;

/// Qwen3.5's Gated DeltaNet layers as llama.cpp's converter describes them: which layers
/// are recurrent (`attention.recurrent_layers`, else every `full_attention_interval`-th is
/// full), the key heads (`ssm.group_count`) of `ssm.state_size`, the value heads
/// (`ssm.time_step_rank`) filling `ssm.inner_size`, the convolution's width, and whether
/// the value heads are in its tiled order (Qwen3.5's files; Qwen3-Next's keep them grouped).
pub(super) fn linear_attention_from_gguf(
    file: &GgufFile,
    arch: &str,
    layers: usize,
    v_heads_tiled: bool,
) -> Result<LinearAttentionConfig, LoadError> {
    let key = |k: &str| format!("{arch}.{k}");
    let req = |k: &str| -> Result<usize, LoadError> {
        file.get(&key(k))
            .and_then(GgufValue::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| LoadError::Config(format!("GGUF lacks metadata {}", key(k))))
    };
    let recurrent = match file.get(&key("attention.recurrent_layers")) {
        Some(v) => (v.as_array().unwrap_or(&[]).iter())
            .map(|b| b.as_bool())
            .collect::<Option<Vec<bool>>>()
            .ok_or_else(|| {
                LoadError::Config(format!(
                    "{} must be booleans",
                    key("attention.recurrent_layers")
                ))
            })?,
        None => {
            let every = req("full_attention_interval")?.max(1);
            (0..layers).map(|i| (i + 1) % every != 0).collect()
        }
    };
    let num_value_heads = req("ssm.time_step_rank")?;
    let inner = req("ssm.inner_size")?;
    if num_value_heads == 0 || !inner.is_multiple_of(num_value_heads) {
        return Err(LoadError::Config(format!(
            "{} ({inner}) is not a multiple of {} ({num_value_heads})",
            key("ssm.inner_size"),
            key("ssm.time_step_rank")
        )));
    }
    Ok(LinearAttentionConfig {
        layers: recurrent,
        num_key_heads: req("ssm.group_count")?,
        num_value_heads,
        key_head_dim: req("ssm.state_size")?,
        value_head_dim: inner / num_value_heads,
        conv_kernel_dim: req("ssm.conv_kernel")?,
        v_heads_tiled,
    })
}
