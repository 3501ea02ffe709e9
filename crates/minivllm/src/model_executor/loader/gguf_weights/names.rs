//! llama.cpp's tensor names as transformers' names.

use super::gemma4;
use crate::config::ModelFamily;

/// The layer, Hugging Face projection and `weight` or `bias` of llama.cpp's tensor of
/// every expert's `ffn_gate`, `ffn_up` or `ffn_down` (`blk.N.ffn_gate_exps.weight`).
pub(super) fn merged_experts(gguf: &str) -> Option<(usize, &'static str, &'static str)> {
    let (layer, part) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let (proj, kind) = part.split_once('.')?;
    let proj = match proj {
        "ffn_gate_exps" => "gate_proj",
        "ffn_up_exps" => "up_proj",
        "ffn_down_exps" => "down_proj",
        "ffn_gate_up_exps" => "gate_up_proj",
        _ => return None,
    };
    let kind = match kind {
        "weight" => "weight",
        "bias" => "bias",
        _ => return None,
    };
    Some((layer.parse().ok()?, proj, kind))
}

/// llama.cpp's tensor names -> transformers' names, for a model of `family`.
pub fn hf_name(gguf: &str, family: ModelFamily) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let gemma4 = family == ModelFamily::Gemma4;
    if let Some(hf) = gemma4.then(|| gemma4::global_name(gguf)).flatten() {
        return Some(hf.into());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if let Some(hf) = gemma4.then(|| gemma4::layer_name(part)).flatten() {
        return Some(format!("model.layers.{layer}.{hf}"));
    }
    // Gemma's norm after attention takes LLaMA's name for the norm before the MLP, which
    // Gemma calls `pre_feedforward_layernorm`. Phi-3's `ffn_up` holds gate and up fused.
    let gemma = family.is_gemma();
    let phi3 = family == ModelFamily::Phi3;
    // gpt-oss's MLP norm is written under Gemma's name for the norm after attention, and
    // so is Qwen3.5's.
    let gpt_oss = family == ModelFamily::GptOss;
    let qwen35 = family.is_qwen35();
    let hf = match part {
        // Qwen3.5's Gated DeltaNet (llama.cpp's `ssm_*`): `attn_qkv` is its q/k/v
        // projection there, `attn_gate` its z, and `ssm_a` holds −exp(A_log).
        "attn_qkv.weight" if qwen35 => "linear_attn.in_proj_qkv.weight",
        "attn_gate.weight" if qwen35 => "linear_attn.in_proj_z.weight",
        "ssm_beta.weight" => "linear_attn.in_proj_b.weight",
        // Qwen3-Next's b and a, interleaved per key-head group as in its checkpoints.
        "ssm_ba.weight" => "linear_attn.in_proj_ba.weight",
        "ssm_alpha.weight" => "linear_attn.in_proj_a.weight",
        "ssm_conv1d.weight" => "linear_attn.conv1d.weight",
        "ssm_dt.bias" => "linear_attn.dt_bias",
        "ssm_a" => "linear_attn.ssm_a",
        "ssm_norm.weight" => "linear_attn.norm.weight",
        "ssm_out.weight" => "linear_attn.out_proj.weight",
        "post_attention_norm.weight" if qwen35 => "post_attention_layernorm.weight",
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" if gemma => "pre_feedforward_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "post_attention_norm.weight" if gemma || gpt_oss => "post_attention_layernorm.weight",
        "post_ffw_norm.weight" if gemma => "post_feedforward_layernorm.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_qkv.weight" => "self_attn.qkv_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_output.bias" => "self_attn.o_proj.bias",
        "attn_sinks.weight" => "self_attn.sinks",
        "ffn_up.weight" if phi3 => "mlp.gate_up_proj.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        // Mixture of experts: the router, and Qwen2-MoE's shared expert and its gate.
        "ffn_gate_inp.weight" => "mlp.gate.weight",
        "ffn_gate_inp.bias" => "mlp.gate.bias",
        "ffn_gate_inp_shexp.weight" => "mlp.shared_expert_gate.weight",
        "ffn_gate_shexp.weight" => "mlp.shared_expert.gate_proj.weight",
        "ffn_up_shexp.weight" => "mlp.shared_expert.up_proj.weight",
        "ffn_down_shexp.weight" => "mlp.shared_expert.down_proj.weight",
        other => {
            // Older Mixtral files hold one tensor per expert: `ffn_gate.3.weight`.
            let (proj, rest) = other.split_once('.')?;
            let (expert, "weight") = rest.split_once('.')? else {
                return None;
            };
            let expert: usize = expert.parse().ok()?;
            let proj = match proj {
                "ffn_gate" => "gate_proj",
                "ffn_up" => "up_proj",
                "ffn_down" => "down_proj",
                _ => return None,
            };
            return Some(format!(
                "model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
            ));
        }
    };
    Some(format!("model.layers.{layer}.{hf}"))
}
