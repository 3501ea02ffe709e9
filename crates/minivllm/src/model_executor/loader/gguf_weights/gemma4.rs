//! Gemma 4 in a GGUF file, as llama.cpp's converter writes it: the full layers' head size
//! in `attention.key_length` and the sliding ones' in `key_length_swa`, per-layer KV heads
//! and MLP widths as arrays where they differ, which layers slide as a boolean array, the
//! proportional RoPE as a `rope_freqs` tensor (1 for each turning pair, 1e30 for the
//! others), keys as values where a full layer has no `attn_v`, and its own tensor names.

use crate::config::{
    Activation, Gemma4Config, ModelConfig, ModelFamily, MoeConfig, PerLayerInput, RopeScaling,
    RouterScoring,
};
use crate::model_executor::loader::gguf::{GgufFile, GgufValue};
use crate::model_executor::loader::LoadError;

/// The configuration of a `gemma4` file.
pub(super) fn gemma4_config(file: &GgufFile, arch: &str) -> Result<ModelConfig, LoadError> {
    let key = |k: &str| format!("{arch}.{k}");
    let bad = |m: String| LoadError::Config(m);
    let uint = |k: &str| {
        file.get(&key(k))
            .and_then(GgufValue::as_u64)
            .map(|v| v as usize)
    };
    let req = |k: &str| uint(k).ok_or_else(|| bad(format!("GGUF lacks metadata {}", key(k))));
    let float = |k: &str| {
        file.get(&key(k))
            .and_then(GgufValue::as_f64)
            .map(|f| f as f32)
    };
    let layers = req("block_count")?;
    if layers == 0 {
        return Err(bad(format!("{} must be positive", key("block_count"))));
    }
    // A number for every layer, or one per layer.
    let per_layer = |k: &str| -> Result<Option<Vec<usize>>, LoadError> {
        let Some(v) = file.get(&key(k)) else {
            return Ok(None);
        };
        let values = match v.as_array() {
            Some(a) => a.iter().map(GgufValue::as_u64).collect::<Option<Vec<_>>>(),
            None => v.as_u64().map(|n| vec![n; layers]),
        };
        match values {
            Some(v) if v.len() == layers => Ok(Some(v.into_iter().map(|n| n as usize).collect())),
            _ => Err(bad(format!("{}: one integer, or one per layer", key(k)))),
        }
    };
    let sliding: Vec<bool> = file
        .get(&key("attention.sliding_window_pattern"))
        .and_then(GgufValue::as_array)
        .and_then(|a| a.iter().map(GgufValue::as_bool).collect())
        .filter(|s: &Vec<bool>| s.len() == layers)
        .ok_or_else(|| {
            bad(format!(
                "{} must be a boolean per layer",
                key("attention.sliding_window_pattern")
            ))
        })?;
    let hidden_size = req("embedding_length")?;
    let heads = req("attention.head_count")?;
    let (full_hd, head_dim) = (
        req("attention.key_length")?,
        req("attention.key_length_swa")?,
    );
    let first_full = sliding.iter().position(|s| !s);
    let first_sliding = sliding.iter().position(|&s| s).unwrap_or(0);
    let kv = per_layer("attention.head_count_kv")?.unwrap_or(vec![heads; layers]);
    let ff = per_layer("feed_forward_length")?.ok_or_else(|| {
        bad(format!(
            "GGUF lacks metadata {}",
            key("feed_forward_length")
        ))
    })?;
    let shared = uint("attention.shared_kv_layers").unwrap_or(0);
    let first_shared = layers.saturating_sub(shared);
    let intermediate_size = ff[0];
    // The converter writes the fraction of turning pairs only as `rope_freqs`.
    let fraction = match file.tensor("rope_freqs.weight") {
        Some(info) => {
            let f = file.dequantize_tensor(info)?;
            let turning = f.iter().take_while(|&&x| x == 1.0).count();
            (2 * turning) as f32 / full_hd as f32
        }
        None => 1.0,
    };
    let k_eq_v = first_full.is_some_and(|i| {
        i < first_shared
            && file.tensor(&format!("blk.{i}.attn_v.weight")).is_none()
            && file.tensor(&format!("blk.{i}.attn_k.weight")).is_some()
    });
    let per_layer_input = match uint("embedding_length_per_layer_input").filter(|&p| p > 0) {
        Some(hidden) => Some(PerLayerInput {
            hidden,
            vocab: file
                .tensor("per_layer_token_embd.weight")
                .and_then(|t| t.shape().first().copied())
                .ok_or_else(|| bad("per-layer inputs but no per_layer_token_embd".into()))?,
        }),
        None => None,
    };
    let moe = match uint("expert_count").filter(|&n| n > 0) {
        Some(num_experts) => Some(MoeConfig {
            num_experts,
            num_experts_per_tok: req("expert_used_count")?,
            moe_intermediate_size: req("expert_feed_forward_length")?,
            scoring: RouterScoring::SoftmaxThenTopK,
            norm_topk_prob: true,
            shared_expert_intermediate_size: None,
            dense_layers: Vec::new(),
        }),
        None => None,
    };
    let vocab_size = match file.tensor("token_embd.weight") {
        Some(t) => t.shape().first().copied().unwrap_or(0),
        None => return Err(bad("GGUF lacks token_embd.weight".into())),
    };
    let gemma4 = Gemma4Config {
        full_head_dim: full_hd,
        full_kv_heads: first_full.map_or(kv[0], |i| kv[i]),
        k_eq_v,
        num_kv_shared_layers: shared,
        double_wide_mlp: ff.last().is_some_and(|&w| w == 2 * intermediate_size) && shared > 0,
        per_layer_input,
    };
    let cfg = ModelConfig {
        architecture: arch.to_string(),
        family: ModelFamily::Gemma4,
        qkv_bias: false,
        o_bias_and_sinks: false,
        qk_norm: ModelFamily::Gemma4.qk_norm(),
        sandwich_norms: true,
        hidden_act: Activation::GeluTanh,
        embedding_multiplier: Some((hidden_size as f64).sqrt() as f32),
        norm_weight_offset: 0.0,
        query_pre_attn_scalar: Some(1.0),
        attn_logit_softcapping: None,
        final_logit_softcapping: float("final_logit_softcapping"),
        sliding_window: Some(req("attention.sliding_window")?),
        sliding_layers: sliding,
        rope_local_theta: Some(float("rope.freq_base_swa").unwrap_or(10_000.0)),
        vocab_size,
        hidden_size,
        intermediate_size,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv[first_sliding],
        head_dim,
        rotary_dim: head_dim,
        max_position_embeddings: uint("context_length").unwrap_or(2048),
        rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        rope_theta: float("rope.freq_base").unwrap_or(1_000_000.0),
        rope_scaling: RopeScaling::Proportional {
            fraction,
            factor: 1.0,
        },
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        moe,
        linear_attention: None,
        attn_output_gate: false,
        gemma4: Some(gemma4),
    };
    cfg.validate()?;
    // What the file says per layer must be what the configuration makes of it.
    for i in 0..layers {
        let (_, kv_heads, _) = cfg.layer_attention(i);
        if kv[i] != kv_heads || ff[i] != cfg.layer_intermediate_size(i) {
            return Err(bad(format!(
                "layer {i}: {} KV heads and an MLP {} wide, where the file's other layers \
                 make it {kv_heads} and {}",
                kv[i],
                ff[i],
                cfg.layer_intermediate_size(i)
            )));
        }
    }
    Ok(cfg)
}

/// A global tensor's Hugging Face name (the per-layer inputs').
pub(super) fn global_name(gguf: &str) -> Option<&'static str> {
    Some(match gguf {
        "per_layer_token_embd.weight" => "model.embed_tokens_per_layer.weight",
        "per_layer_model_proj.weight" => "model.per_layer_model_projection.weight",
        "per_layer_proj_norm.weight" => "model.per_layer_projection_norm.weight",
        _ => return None,
    })
}

/// A layer tensor's Hugging Face name within its layer, where Gemma 4's differs from the
/// other families'.
pub(super) fn layer_name(part: &str) -> Option<&'static str> {
    Some(match part {
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "layer_output_scale.weight" => "layer_scalar",
        "inp_gate.weight" => "per_layer_input_gate.weight",
        "proj.weight" => "per_layer_projection.weight",
        "post_norm.weight" => "post_per_layer_input_norm.weight",
        "ffn_gate_inp.weight" => "router.proj.weight",
        "ffn_gate_inp.scale" => "router.scale",
        "ffn_down_exps.scale" => "router.per_expert_scale",
        "pre_ffw_norm_2.weight" => "pre_feedforward_layernorm_2.weight",
        "post_ffw_norm_1.weight" => "post_feedforward_layernorm_1.weight",
        "post_ffw_norm_2.weight" => "post_feedforward_layernorm_2.weight",
        _ => return None,
    })
}
