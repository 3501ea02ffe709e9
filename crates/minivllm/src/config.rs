//! The model's architecture hyper-parameters, read from a Hugging Face `config.json`
//! or from a GGUF file's `llama.*` metadata.

use serde_json::Value;

use crate::distributed::share;

mod gemma4;
mod kv_cache_layout;
mod kv_events;
mod kv_transfer;
pub(crate) mod linear_attention;
mod model_family;
mod moe;
mod rope_scaling;
mod speculative;

pub use gemma4::{Gemma4Config, PerLayerInput};
pub use kv_cache_layout::{first_needed_block, KvCacheLayout, LayerPlace};
pub use kv_events::{KvEventsConfig, KvEventsPublisher};
pub use kv_transfer::{
    KvLoadFailurePolicy, KvRole, KvTransferConfig, TcpConnectorConfig, TCP_CONNECTOR,
};
pub use linear_attention::LinearAttentionConfig;
pub(crate) use model_family::supported_architectures;
pub use model_family::ModelFamily;
pub use moe::{MoeConfig, RouterScoring, MAX_EXPERTS};
use rope_scaling::parse_hf_rope_scaling;
pub use rope_scaling::{yarn_mscale, RopeScaling};
pub use speculative::{
    DraftModelConfig, NgramConfig, SpeculativeConfig, SpeculativeMethod, SpeculativeMethodConfig,
    MAX_SPECULATIVE_TOKENS,
};

/// Why a model's configuration cannot be used. (The loaders report it as their
/// `LoadError`, under the same messages.)
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("bad model config: {0}")]
    Invalid(String),
    #[error(
        "unsupported model architecture {0:?} (supported: {supported})",
        supported = supported_architectures()
    )]
    UnsupportedArchitecture(String),
}

/// Where q and k are normalised before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Over each head's `head_dim` values (Qwen3, Gemma 3).
    PerHead,
    /// Over the whole q projection and the whole k projection (OLMoE).
    Whole,
}

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// SwiGLU (`silu`).
    Silu,
    /// GeGLU with the tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss's experts: `(clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)`, `g` the gate
    /// clamped above at `limit` (llama.cpp's `swiglu_oai`).
    SwigluOai { alpha: f32, limit: f32 },
}

/// gpt-oss's SwiGLU as its configs and llama.cpp's graph (which reads neither from the
/// file) fix it.
pub(crate) const GPT_OSS_SWIGLU: Activation = Activation::SwigluOai {
    alpha: 1.702,
    limit: 7.0,
};

impl Activation {
    fn from_hf(name: &str) -> Result<Self, ConfigError> {
        match name {
            "silu" | "swish" => Ok(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_tanh" => Ok(Activation::GeluTanh),
            other => Err(ConfigError::Invalid(format!(
                "unsupported hidden_act {other:?} (supported: silu, gelu_pytorch_tanh)"
            ))),
        }
    }
}

/// The largest width, vocabulary, layer or head count a configuration may give (16,777,216):
/// a thousand times today's largest models, and small enough that products of two such
/// sizes cannot overflow a 64-bit `usize`.
pub(crate) const MAX_DIMENSION: usize = 1 << 24;

/// The largest `head_dim` (LLaMA-family models use 64 to 256): the RoPE table built at load
/// holds 8,192 positions of it.
pub(crate) const MAX_HEAD_DIM: usize = 1 << 12;

/// Hyper-parameters of a LLaMA-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family's GGUF name (`llama`, `mistral`, `qwen2`): see [`ModelFamily`].
    pub architecture: String,
    pub family: ModelFamily,
    /// A bias on the q, k and v projections (Qwen2, gpt-oss).
    pub qkv_bias: bool,
    /// A bias on the output projection, and a learned sink logit per head that joins each
    /// head's softmax (gpt-oss).
    pub o_bias_and_sinks: bool,
    /// An RMSNorm over q and k before RoPE (Qwen3 and Gemma 3 per head, OLMoE whole).
    pub qk_norm: QkNorm,
    /// Gemma's extra norms after attention and after the MLP, before each residual add (its
    /// MLP's input norm is then `pre_feedforward_layernorm`).
    pub sandwich_norms: bool,
    pub hidden_act: Activation,
    /// Token embeddings are multiplied by this (Gemma: √hidden_size).
    pub embedding_multiplier: Option<f32>,
    /// Added to every RMSNorm weight as it is loaded: Gemma's checkpoints hold `w` of
    /// `x·(1 + w)` (llama.cpp's converter adds the 1 into its GGUF files itself).
    pub norm_weight_offset: f32,
    /// Scores are scaled by `1/√query_pre_attn_scalar` (Gemma) instead of `1/√head_dim`.
    pub query_pre_attn_scalar: Option<f32>,
    /// Gemma 2's soft-capping of the scaled attention scores and of the final logits: each
    /// `x` becomes `cap · tanh(x / cap)`.
    pub attn_logit_softcapping: Option<f32>,
    pub final_logit_softcapping: Option<f32>,
    /// The window of the sliding-window layers (a query sees its last `w` positions).
    pub sliding_window: Option<usize>,
    /// Which layers slide (`[num_hidden_layers]`; empty when none do).
    pub sliding_layers: Vec<bool>,
    /// The RoPE base of the sliding-window layers where it is their own (Gemma 3's
    /// `rope_local_base_freq`, unscaled).
    pub rope_local_theta: Option<f32>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// The dims of each head that RoPE rotates (the first ones): `head_dim`, or a part of it
    /// (Phi-4-mini's `partial_rotary_factor` 0.75).
    pub rotary_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: bool,
    /// Routed experts in place of the MLP (`None`: a dense model).
    pub moe: Option<MoeConfig>,
    /// Linear-attention layers among the layers (`None`: every layer attends).
    pub linear_attention: Option<LinearAttentionConfig>,
    /// The q projection gives each head a second `head_dim` of gate logits, and the
    /// attention output is multiplied by their sigmoid before the output projection
    /// (Qwen3.5's full-attention layers).
    pub attn_output_gate: bool,
    /// Gemma 4's own parts: the full-attention layers' shape, K/V shared across layers,
    /// per-layer input embeddings.
    pub gemma4: Option<Gemma4Config>,
}

impl ModelConfig {
    /// Checks the shapes fit together, so the model code can rely on them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} must be positive"));
        }
        self.validate_bounds()?;
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            ));
        }
        // Zero rotated dims would run the model with no positions at all.
        if !self.rotary_dim.is_multiple_of(2) || !(2..=self.head_dim).contains(&self.rotary_dim) {
            return bad(format!(
                "the rotary dimension ({}) must be even, at least 2 and at most head_dim ({})",
                self.rotary_dim, self.head_dim
            ));
        }
        // Written so that NaN fails: such values load fine and then yield NaN logits.
        let positive_finite = |x: f32| x.is_finite() && x > 0.0;
        if !positive_finite(self.rope_theta) {
            return bad(format!(
                "rope_theta must be a positive number, got {}",
                self.rope_theta
            ));
        }
        if !positive_finite(self.rms_norm_eps) {
            return bad(format!(
                "rms_norm_eps must be a positive number, got {}",
                self.rms_norm_eps
            ));
        }
        let optional = [
            ("query_pre_attn_scalar", self.query_pre_attn_scalar),
            ("rope_local_base_freq", self.rope_local_theta),
            ("embedding multiplier", self.embedding_multiplier),
            ("attn_logit_softcapping", self.attn_logit_softcapping),
            ("final_logit_softcapping", self.final_logit_softcapping),
        ];
        if let Some((name, Some(v))) = optional
            .iter()
            .find(|(_, v)| v.is_some_and(|v| !positive_finite(v)))
        {
            return bad(format!("{name} must be a positive number, got {v}"));
        }
        if !self.norm_weight_offset.is_finite() {
            return bad("the norm weight offset must be finite".into());
        }
        if self.sliding_window == Some(0) {
            return bad("sliding_window must be positive".into());
        }
        if !self.sliding_layers.is_empty()
            && (self.sliding_layers.len() != self.num_hidden_layers
                || self.sliding_window.is_none())
        {
            return bad(format!(
                "{} layer types for {} layers{}",
                self.sliding_layers.len(),
                self.num_hidden_layers,
                if self.sliding_window.is_none() {
                    " and no sliding_window"
                } else {
                    ""
                }
            ));
        }
        if let Some(moe) = &self.moe {
            moe.validate(self.num_hidden_layers)?;
        }
        if let Some(linear) = &self.linear_attention {
            linear.validate(self.num_hidden_layers)?;
        }
        match &self.gemma4 {
            Some(g) => {
                g.validate(&self.layer_kinds())?;
                let heads = self.num_attention_heads;
                let wide = |n: usize| {
                    n.checked_mul(g.full_head_dim)
                        .is_none_or(|w| w > MAX_DIMENSION)
                };
                if !heads.is_multiple_of(g.full_kv_heads) || wide(heads) || wide(g.full_kv_heads) {
                    return bad(format!(
                        "the full-attention layers' {} KV heads of {} do not fit {heads} heads \
                         (a divisor of them, and at most {MAX_DIMENSION} wide)",
                        g.full_kv_heads, g.full_head_dim
                    ));
                }
            }
            None if self.family == ModelFamily::Gemma4 => {
                return bad("a Gemma 4 configuration without its layers' shapes".into())
            }
            None => {}
        }
        self.rope_scaling.validate(self.rotary_dim)?;
        if let RopeScaling::FreqFactors(f) = &self.rope_scaling {
            if f.len() != self.rotary_dim / 2 {
                return bad(format!(
                    "rope frequency factors: {} values, expected one per rotary frequency \
                     ({})",
                    f.len(),
                    self.rotary_dim / 2
                ));
            }
        }
        Ok(())
    }

    /// Every size below its largest supported value, products included, so that nothing
    /// sized from them overflows; a size that fits is still checked against the weights'
    /// shapes before it sizes a buffer (`LlamaForCausalLM::load_parallel`).
    fn validate_bounds(&self) -> Result<(), ConfigError> {
        let above = |name: &str, v: usize, max: usize| {
            Err(ConfigError::Invalid(format!(
                "{name} {v} is above the largest supported ({max})"
            )))
        };
        let sizes = [
            ("hidden_size", self.hidden_size, MAX_DIMENSION),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
            ("intermediate_size", self.intermediate_size, MAX_DIMENSION),
            ("vocab_size", self.vocab_size, MAX_DIMENSION),
            ("num_hidden_layers", self.num_hidden_layers, MAX_DIMENSION),
            (
                "num_attention_heads",
                self.num_attention_heads,
                MAX_DIMENSION,
            ),
            (
                "num_key_value_heads",
                self.num_key_value_heads,
                MAX_DIMENSION,
            ),
        ];
        if let Some(&(name, v, max)) = sizes.iter().find(|(_, v, max)| v > max) {
            return above(name, v, max);
        }
        for (name, heads) in [
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
        ] {
            let width = heads.checked_mul(self.head_dim);
            if width.is_none_or(|w| w > MAX_DIMENSION) {
                return Err(ConfigError::Invalid(format!(
                    "{name} × head_dim ({heads} × {}) is above the largest supported \
                     ({MAX_DIMENSION})",
                    self.head_dim
                )));
            }
        }
        Ok(())
    }

    /// The heads and KV heads each of `world_size` ranks computes, when attention splits
    /// over them in whole KV groups (KV heads fewer than the ranks are replicated on the
    /// ranks whose query heads use them, as vLLM does); `None` when it does not, and every
    /// rank then computes all the heads.
    pub(crate) fn attention_split(&self, world_size: usize) -> Option<(usize, usize)> {
        let (heads, kv) = (self.num_attention_heads, self.num_key_value_heads);
        if world_size <= 1 {
            return Some((heads, kv));
        }
        // A norm over every head's q at once needs them all on one rank; Gemma 4's full
        // layers have KV heads of their own, which would need splits of their own.
        if self.qk_norm == QkNorm::Whole || self.gemma4.is_some() {
            return None;
        }
        if kv.is_multiple_of(world_size) {
            Some((heads / world_size, kv / world_size))
        } else if world_size.is_multiple_of(kv) && heads.is_multiple_of(world_size) {
            Some((heads / world_size, 1))
        } else {
            None
        }
    }

    /// Rank `rank`'s part of the model out of `world_size`: its attention heads and KV heads
    /// ([`Self::attention_split`], or all of them), and its share of the MLP's width and of
    /// the vocabulary ([`share`]: any width splits, the first ranks holding one more).
    pub(crate) fn tensor_parallel_part(&self, rank: usize, world_size: usize) -> ModelConfig {
        let (heads, kv) = self
            .attention_split(world_size)
            .unwrap_or((self.num_attention_heads, self.num_key_value_heads));
        ModelConfig {
            num_attention_heads: heads,
            num_key_value_heads: kv,
            intermediate_size: share(self.intermediate_size, rank, world_size).len(),
            vocab_size: share(self.vocab_size, rank, world_size).len(),
            moe: self
                .moe
                .as_ref()
                .map(|m| m.tensor_parallel_part(rank, world_size)),
            ..self.clone()
        }
    }

    /// The sliding window of layer `i`, if it is a sliding-window layer.
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| self.sliding_layers.get(i).copied().unwrap_or(false))
    }

    /// The scale of attention scores.
    pub(crate) fn attention_scale(&self) -> f32 {
        1.0 / self
            .query_pre_attn_scalar
            .unwrap_or(self.head_dim as f32)
            .sqrt()
    }

    pub(crate) fn q_size(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub(crate) fn kv_size(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Parses a Hugging Face `config.json` (transformers 4 and 5 layouts). A multimodal
    /// checkpoint's (`…ForConditionalGeneration` with a `text_config`) gives its language
    /// model's: the engine runs text, and its vision tower is not loaded.
    pub fn from_hf_json(json: &Value) -> Result<Self, ConfigError> {
        let arch = json
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| json.get("model_type").and_then(Value::as_str))
            .unwrap_or("<missing>");
        if let Some(text) = json.get("text_config").filter(|t| t.is_object()) {
            if arch.ends_with("ForConditionalGeneration") {
                tracing::info!(
                    architecture = arch,
                    "a multimodal checkpoint: its text model is loaded, not its vision tower"
                );
                let mut text = text.clone();
                text.as_object_mut()
                    .expect("an object")
                    .remove("architectures");
                if let Some(tie) = json.get("tie_word_embeddings") {
                    text.as_object_mut()
                        .expect("an object")
                        .entry("tie_word_embeddings")
                        .or_insert_with(|| tie.clone());
                }
                return Self::from_hf_json(&text);
            }
        }
        let family = ModelFamily::from_name(arch)?;
        // Llama's `attention_bias` puts a bias on the output projection too, which the
        // shared decoder does not hold: refused rather than run without it.
        if json.get("attention_bias").and_then(Value::as_bool) == Some(true) && !family.qkv_bias() {
            return Err(ConfigError::Invalid(
                "attention_bias: true is not supported for this architecture".into(),
            ));
        }
        // Gemma names it `hidden_activation`; an activation the family does not use would
        // compute a different model.
        let hidden_act = match json
            .get("hidden_activation")
            .or_else(|| json.get("hidden_act"))
            .and_then(Value::as_str)
        {
            // gpt-oss says `silu` but its experts run their own clamped SwiGLU.
            _ if family == ModelFamily::GptOss => gpt_oss_swiglu(json)?,
            Some(name) => Activation::from_hf(name)?,
            None if family.is_gemma() || family == ModelFamily::Gemma4 => Activation::GeluTanh,
            None => Activation::Silu,
        };
        // OLMoE's clipping of q, k and v (its released checkpoints set none).
        if json.get("clip_qkv").is_some_and(|v| !v.is_null()) {
            return Err(ConfigError::Invalid("clip_qkv is not supported".into()));
        }
        let gemma = family.is_gemma();
        let gemma4 = family == ModelFamily::Gemma4;
        let hidden_size = req_usize(json, "hidden_size")?;
        let num_attention_heads = req_usize(json, "num_attention_heads")?;
        let head_dim = match opt_usize(json, "head_dim")? {
            Some(d) => d,
            None => hidden_size / num_attention_heads.max(1),
        };
        // transformers 5 moved rope settings into `rope_parameters`; older files keep them
        // at the top level as `rope_theta` and `rope_scaling`.
        let rope_params = json.get("rope_parameters").filter(|v| v.is_object());
        let rope_theta = rope_params
            .and_then(|p| p.get("rope_theta"))
            .or_else(|| json.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0) as f32;
        let mut scaling = json
            .get("rope_scaling")
            .filter(|v| v.is_object())
            .or(rope_params);
        // Gemma 3 in transformers 5: one set of rope parameters per layer type.
        let per_type = |t: &str| rope_params.and_then(|p| p.get(t)).filter(|v| v.is_object());
        let mut rope_theta = rope_theta;
        if let Some(full) = per_type("full_attention") {
            scaling = Some(full);
            if let Some(theta) = full.get("rope_theta").and_then(Value::as_f64) {
                rope_theta = theta as f32;
            }
        }
        let rope_local_theta = per_type("sliding_attention")
            .and_then(|p| p.get("rope_theta"))
            .or_else(|| json.get("rope_local_base_freq"))
            .and_then(Value::as_f64)
            .map(|t| t as f32)
            .or((family == ModelFamily::Gemma3 || gemma4).then_some(10_000.0));
        // Phi-4-mini rotates only the first dims of each head; transformers 5 keeps the
        // factor among the rope parameters, 4 at the top level (and truncates the product).
        // Gemma 4's factor belongs to its full layers' "proportional" RoPE, which turns the
        // whole head (some of its frequencies zero).
        let partial = scaling
            .and_then(|p| p.get("partial_rotary_factor"))
            .or_else(|| json.get("partial_rotary_factor"))
            .and_then(Value::as_f64)
            .filter(|_| !gemma4)
            .unwrap_or(1.0);
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "partial_rotary_factor must be in (0, 1], got {partial}"
            )));
        }
        let rotary_dim = (head_dim as f64 * partial) as usize;
        let num_hidden_layers = req_usize(json, "num_hidden_layers")?;
        let (sliding_window, sliding_layers) =
            sliding_layers_from_hf(json, family, num_hidden_layers)?;
        let moe = MoeConfig::from_hf(json, family, num_hidden_layers)?;
        let cfg = ModelConfig {
            architecture: family.gguf_name().to_string(),
            family,
            qkv_bias: family.qkv_bias(),
            o_bias_and_sinks: family.o_bias_and_sinks(),
            qk_norm: family.qk_norm(),
            sandwich_norms: gemma || gemma4,
            hidden_act,
            // transformers computes √hidden in double precision and rounds it to the weights'.
            embedding_multiplier: (gemma || gemma4).then(|| (hidden_size as f64).sqrt() as f32),
            // Qwen3.5's norms are zero-centred too (`x·(1 + w)`).
            norm_weight_offset: if gemma || family.is_qwen35() {
                1.0
            } else {
                0.0
            },
            query_pre_attn_scalar: if gemma {
                Some(
                    json.get("query_pre_attn_scalar")
                        .and_then(Value::as_f64)
                        .unwrap_or(256.0) as f32,
                )
            } else if gemma4 {
                // Gemma 4 leaves its scores unscaled (its q and k are normed instead).
                Some(1.0)
            } else {
                None
            },
            // Gemma 2's soft-capping, which transformers applies wherever a config sets it.
            attn_logit_softcapping: opt_positive_f32(json, "attn_logit_softcapping")?,
            final_logit_softcapping: opt_positive_f32(json, "final_logit_softcapping")?,
            sliding_window,
            sliding_layers,
            rope_local_theta,
            vocab_size: req_usize(json, "vocab_size")?,
            hidden_size,
            // Qwen3.5-MoE has no dense MLP, and no width for one.
            intermediate_size: match (family, opt_usize(json, "intermediate_size")?) {
                (ModelFamily::Qwen35Moe, None) => req_usize(json, "moe_intermediate_size")?,
                _ => req_usize(json, "intermediate_size")?,
            },
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: opt_usize(json, "num_key_value_heads")?
                .unwrap_or(num_attention_heads),
            head_dim,
            rotary_dim,
            max_position_embeddings: opt_usize(json, "max_position_embeddings")?.unwrap_or(2048),
            rms_norm_eps: json
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            rope_theta,
            rope_scaling: parse_hf_rope_scaling(scaling, json)?,
            // Gemma 4's configs tie unless they say otherwise.
            tie_word_embeddings: json
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(gemma4),
            moe,
            linear_attention: (family.is_qwen35())
                .then(|| LinearAttentionConfig::from_hf(json, num_hidden_layers))
                .transpose()?,
            attn_output_gate: family.is_qwen35()
                && json.get("attn_output_gate").and_then(Value::as_bool) != Some(false),
            gemma4: None,
        };
        let cfg = if gemma4 {
            let mut cfg = cfg;
            // transformers forces Gemma 4's last layer to full attention.
            if let Some(last) = cfg.sliding_layers.last_mut() {
                *last = false;
            }
            let kinds = cfg.layer_kinds();
            ModelConfig {
                gemma4: Some(Gemma4Config::from_hf(
                    json,
                    &kinds,
                    cfg.num_key_value_heads,
                )?),
                ..cfg
            }
        } else {
            cfg
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// gpt-oss's `swiglu_alpha` (transformers 5; 1.702 before) and `swiglu_limit`.
fn gpt_oss_swiglu(json: &Value) -> Result<Activation, ConfigError> {
    let Activation::SwigluOai { alpha, limit } = GPT_OSS_SWIGLU else {
        unreachable!()
    };
    Ok(Activation::SwigluOai {
        alpha: opt_positive_f32(json, "swiglu_alpha")?.unwrap_or(alpha),
        limit: opt_positive_f32(json, "swiglu_limit")?.unwrap_or(limit),
    })
}

/// `key`'s positive, finite number; `None` where the config leaves it out or null.
fn opt_positive_f32(json: &Value, key: &str) -> Result<Option<f32>, ConfigError> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x as f32)),
            _ => Err(ConfigError::Invalid(format!(
                "{key} must be a positive number, got {v}"
            ))),
        },
    }
}

/// The sliding window and which layers use it, as transformers decides: `layer_types` where
/// the config lists them, else the family's rule (Gemma 3: five sliding layers to one
/// global; Mistral: every layer; Qwen: layers from `max_window_layers` on, only with
/// `use_sliding_window`).
fn sliding_layers_from_hf(
    json: &Value,
    family: ModelFamily,
    layers: usize,
) -> Result<(Option<usize>, Vec<bool>), ConfigError> {
    let window = opt_usize(json, "sliding_window")?;
    // Qwen3.5's `layer_types` say which layers are linear attention; none slides.
    let Some(window) = window.filter(|_| !family.is_qwen35()) else {
        return Ok((None, Vec::new()));
    };
    if let Some(types) = json.get("layer_types").and_then(Value::as_array) {
        let sliding = types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(ConfigError::Invalid(format!(
                    "unsupported layer type {t} (supported: full_attention, sliding_attention)"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(if sliding.iter().any(|&s| s) {
            (Some(window), sliding)
        } else {
            (None, Vec::new())
        });
    }
    let sliding: Vec<bool> = match family {
        // transformers' default `layer_types`: sliding first, then every other layer.
        ModelFamily::Gemma2 | ModelFamily::GptOss => (0..layers).map(|i| i % 2 == 0).collect(),
        ModelFamily::Gemma3 => {
            let pattern = opt_usize(json, "sliding_window_pattern")?
                .unwrap_or(6)
                .max(1);
            (0..layers).map(|i| (i + 1) % pattern != 0).collect()
        }
        // transformers 5.19's default: five sliding to one full, and the last layer full.
        ModelFamily::Gemma4 => (0..layers)
            .map(|i| (i + 1) % 6 != 0 && i + 1 != layers)
            .collect(),
        ModelFamily::Mistral | ModelFamily::Phi3 | ModelFamily::Mixtral => vec![true; layers],
        ModelFamily::Qwen2 | ModelFamily::Qwen3 | ModelFamily::Qwen2Moe | ModelFamily::Qwen3Moe => {
            if json.get("use_sliding_window").and_then(Value::as_bool) != Some(true) {
                return Ok((None, Vec::new()));
            }
            let from = opt_usize(json, "max_window_layers")?.unwrap_or(layers);
            (0..layers).map(|i| i >= from).collect()
        }
        ModelFamily::Llama
        | ModelFamily::Olmoe
        | ModelFamily::Qwen35
        | ModelFamily::Qwen35Moe
        | ModelFamily::Qwen3Next => return Ok((None, Vec::new())),
    };
    Ok(if sliding.iter().any(|&s| s) {
        (Some(window), sliding)
    } else {
        (None, Vec::new())
    })
}

pub(crate) fn opt_usize(json: &Value, key: &str) -> Result<Option<usize>, ConfigError> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
            ConfigError::Invalid(format!("{key} must be a non-negative integer, got {v}"))
        }),
    }
}

pub(crate) fn req_usize(json: &Value, key: &str) -> Result<usize, ConfigError> {
    opt_usize(json, key)?.ok_or_else(|| ConfigError::Invalid(format!("config.json lacks {key}")))
}

#[cfg(test)]
mod tests;
