//! The model families the engine runs and the names that pick each: a GGUF file's
//! `general.architecture`, a `config.json`'s `architectures` or `model_type`.

use super::{ConfigError, QkNorm};

/// The model families the engine runs, as vLLM's model registry names them: each is picked
/// by a GGUF file's `general.architecture` or a `config.json`'s `architectures`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFamily {
    /// Llama 2/3, SmolLM2, TinyLlama.
    Llama,
    /// Mistral: LLaMA with a sliding window on every layer (v0.1).
    Mistral,
    /// Qwen2 and Qwen2.5: LLaMA with a bias on the q, k and v projections.
    Qwen2,
    /// Qwen3: LLaMA with an RMSNorm over each head's q and k before RoPE.
    Qwen3,
    /// Gemma 2: GeGLU, (1 + w) norms around attention and the MLP, scaled embeddings,
    /// every other layer sliding, and its scores and logits soft-capped (`cap · tanh(x /
    /// cap)`).
    Gemma2,
    /// Gemma 3's text model: Gemma 2 with q/k norms instead of the soft-capping, five
    /// sliding layers to one global, and the sliding layers' own RoPE base.
    Gemma3,
    /// Gemma 4's text model: Gemma 3's layout with plain (`x·w`) norms, unscaled scores, a
    /// weightless norm on v, full-attention layers of their own head size and KV heads
    /// (keys as values where `attention_k_eq_v`) with "proportional" RoPE, the last layers
    /// reading earlier layers' K/V, per-layer input embeddings and a stored scale per layer
    /// (`config/gemma4.rs`).
    Gemma4,
    /// Phi-3 and Phi-4: LLaMA with q/k/v and gate/up stored fused, LongRoPE for the 128k
    /// variants, a partial rotary dimension (Phi-4-mini) and a window on every layer.
    Phi3,
    /// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2 with routed experts and a gated
    /// shared expert in place of the MLP.
    Qwen2Moe,
    /// Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3 with routed experts.
    Qwen3Moe,
    /// Mixtral: Mistral with routed experts (top 2 of 8). llama.cpp's files call it
    /// `llama` and say `llama.expert_count`.
    Mixtral,
    /// OLMoE: LLaMA with routed experts and an RMSNorm over the whole q and k projections.
    Olmoe,
    /// gpt-oss (20b, 120b): routed experts with biases and a clamped SwiGLU, picked by the
    /// top router logits; biases on q, k, v and o; a learned attention sink per head;
    /// every other layer sliding (window 128); YaRN.
    GptOss,
    /// Qwen3.5 (dense): three Gated DeltaNet linear-attention layers to one full-attention
    /// layer, whose q projection also gives a sigmoid gate on its output; Qwen3's per-head
    /// q/k norms; (1 + w) norm weights; RoPE over a quarter of each head.
    Qwen35,
    /// Qwen3.5-MoE (35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5 with routed experts (always
    /// renormalised) and a gated shared expert, Qwen2-MoE's, in place of every MLP.
    Qwen35Moe,
    /// Qwen3-Next (80B-A3B): Qwen3.5-MoE's layers before it, with the DeltaNet's q, k, v and
    /// z projections stored fused per key-head group (`in_proj_qkvz`, and b/a in
    /// `in_proj_ba`), `norm_topk_prob` and dense MLPs where `mlp_only_layers` says.
    Qwen3Next,
}

/// GGUF name, Hugging Face class, family.
pub(super) const ARCHITECTURES: &[(&str, &str, ModelFamily)] = &[
    ("llama", "LlamaForCausalLM", ModelFamily::Llama),
    ("mistral", "MistralForCausalLM", ModelFamily::Mistral),
    ("qwen2", "Qwen2ForCausalLM", ModelFamily::Qwen2),
    ("qwen3", "Qwen3ForCausalLM", ModelFamily::Qwen3),
    ("gemma2", "Gemma2ForCausalLM", ModelFamily::Gemma2),
    ("gemma3", "Gemma3ForCausalLM", ModelFamily::Gemma3),
    ("gemma4", "Gemma4ForCausalLM", ModelFamily::Gemma4),
    ("phi3", "Phi3ForCausalLM", ModelFamily::Phi3),
    ("qwen2moe", "Qwen2MoeForCausalLM", ModelFamily::Qwen2Moe),
    ("qwen3moe", "Qwen3MoeForCausalLM", ModelFamily::Qwen3Moe),
    ("mixtral", "MixtralForCausalLM", ModelFamily::Mixtral),
    ("olmoe", "OlmoeForCausalLM", ModelFamily::Olmoe),
    ("gpt-oss", "GptOssForCausalLM", ModelFamily::GptOss),
    ("qwen35", "Qwen3_5ForCausalLM", ModelFamily::Qwen35),
    ("qwen35moe", "Qwen3_5MoeForCausalLM", ModelFamily::Qwen35Moe),
    ("qwen3next", "Qwen3NextForCausalLM", ModelFamily::Qwen3Next),
];

/// For error messages: every name [`ModelFamily::from_name`] takes, from the table.
pub(crate) fn supported_architectures() -> String {
    ARCHITECTURES
        .iter()
        .map(|(gguf, hf, _)| format!("{gguf} ({hf})"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl ModelFamily {
    /// The family of a GGUF architecture name or a Hugging Face class (or `model_type`).
    pub(crate) fn from_name(name: &str) -> Result<Self, ConfigError> {
        // Gemma 3's text-only checkpoints say `model_type: gemma3_text`; Qwen's MoE
        // `model_type`s have an underscore that their GGUF names lack.
        let name = match name {
            "gemma3_text" => "gemma3",
            "gemma4_text" => "gemma4",
            "qwen2_moe" => "qwen2moe",
            "qwen3_moe" => "qwen3moe",
            "gpt_oss" => "gpt-oss",
            "qwen3_5_text" | "qwen3_5" => "qwen35",
            "qwen3_5_moe_text" | "qwen3_5_moe" => "qwen35moe",
            "qwen3_next" => "qwen3next",
            other => other,
        };
        ARCHITECTURES
            .iter()
            .find(|(gguf, hf, _)| name == *gguf || name == *hf)
            .map(|&(_, _, f)| f)
            .ok_or_else(|| ConfigError::UnsupportedArchitecture(name.to_string()))
    }

    /// Its GGUF name, which `ModelConfig::architecture` holds.
    pub fn gguf_name(self) -> &'static str {
        ARCHITECTURES
            .iter()
            .find(|&&(_, _, f)| f == self)
            .map_or("llama", |&(g, _, _)| g)
    }

    /// Whether the q, k and v projections carry a bias.
    pub fn qkv_bias(self) -> bool {
        matches!(
            self,
            ModelFamily::Qwen2 | ModelFamily::Qwen2Moe | ModelFamily::GptOss
        )
    }

    /// Gemma's layout: GeGLU, (1 + w) norms around attention and the MLP, embeddings
    /// scaled by √hidden, scores by `query_pre_attn_scalar`.
    pub(crate) fn is_gemma(self) -> bool {
        matches!(self, ModelFamily::Gemma2 | ModelFamily::Gemma3)
    }

    /// Qwen3.5's layout (dense or MoE, and Qwen3-Next's before it): Gated DeltaNet layers
    /// between gated full-attention ones, (1 + w) norms.
    pub(crate) fn is_qwen35(self) -> bool {
        matches!(
            self,
            ModelFamily::Qwen35 | ModelFamily::Qwen35Moe | ModelFamily::Qwen3Next
        )
    }

    /// Whether the attention's output projection carries a bias, and each head a sink.
    pub fn o_bias_and_sinks(self) -> bool {
        self == ModelFamily::GptOss
    }

    /// Where q and k go through an RMSNorm before RoPE.
    pub(crate) fn qk_norm(self) -> QkNorm {
        match self {
            ModelFamily::Qwen3
            | ModelFamily::Qwen3Moe
            | ModelFamily::Gemma3
            | ModelFamily::Gemma4
            | ModelFamily::Qwen35
            | ModelFamily::Qwen35Moe
            | ModelFamily::Qwen3Next => QkNorm::PerHead,
            ModelFamily::Olmoe => QkNorm::Whole,
            _ => QkNorm::None,
        }
    }
}
