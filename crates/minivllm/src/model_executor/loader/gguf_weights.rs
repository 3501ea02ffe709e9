//! A GGUF file seen as a LLaMA model: its `llama.*` metadata as a [`ModelConfig`] and its
//! tensors under Hugging Face names and layouts.

use std::collections::HashMap;

use super::gguf::{GgufFile, GgufTensorInfo, GgufValue};
use super::weights::{QuantTensor, Tensor, WeightSource};
use super::LoadError;
use crate::config::{
    Activation, ModelConfig, ModelFamily, MoeConfig, RopeScaling, RouterScoring, GPT_OSS_SWIGLU,
    MAX_EXPERTS,
};
use minivllm_kernels::hmatmul::HalfKind;
use minivllm_kernels::quant::GgmlType;

mod gemma4;
mod linear_attention;
mod names;
use linear_attention::linear_attention_from_gguf;
pub use names::hf_name;
use names::merged_experts;

/// Reads the model's hyper-parameters from `<arch>.*` metadata.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig, LoadError> {
    let arch = file
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| LoadError::Config("GGUF lacks general.architecture".into()))?
        .to_string();
    let mut family = ModelFamily::from_name(&arch)?;
    if family == ModelFamily::Gemma4 {
        let cfg = gemma4::gemma4_config(file, &arch)?;
        check_layer_count(file, cfg.num_hidden_layers)?;
        return Ok(cfg);
    }
    let key = |k: &str| format!("{arch}.{k}");
    let uint = |k: &str| -> Result<Option<usize>, LoadError> {
        match file.get(&key(k)) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                LoadError::Config(format!("GGUF metadata {} is not an integer", key(k)))
            }),
        }
    };
    let req = |k: &str| {
        uint(k)?.ok_or_else(|| LoadError::Config(format!("GGUF lacks metadata {}", key(k))))
    };
    let float = |k: &str| {
        file.get(&key(k))
            .and_then(GgufValue::as_f64)
            .map(|f| f as f32)
    };

    // llama.cpp files Mixtral under `llama`, with experts.
    if family == ModelFamily::Llama && uint("expert_count")?.is_some_and(|n| n > 0) {
        family = ModelFamily::Mixtral;
    }
    let hidden_size = req("embedding_length")?;
    let num_attention_heads = req("attention.head_count")?;
    let head_dim = match uint("attention.key_length")? {
        Some(d) => d,
        None => hidden_size / num_attention_heads.max(1),
    };
    let vocab_size = match uint("vocab_size")? {
        Some(v) => v,
        None => file
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map(|a| a.len())
            .ok_or_else(|| LoadError::Config("GGUF gives no vocabulary size".into()))?,
    };
    // Phi-4-mini rotates only the first dims of each head.
    let rotary_dim = uint("rope.dimension_count")?.unwrap_or(head_dim);
    let rope_scaling = rope_scaling_from_gguf(file, &key, rotary_dim)?;
    let num_hidden_layers = req("block_count")?;
    // Qwen3.5-MoE's converter writes no dense width (it has no dense MLP).
    let intermediate_size = match family {
        ModelFamily::Qwen35Moe => match uint("feed_forward_length")? {
            Some(width) => width,
            None => req("expert_feed_forward_length")?,
        },
        _ => req("feed_forward_length")?,
    };
    let gpt_oss = family == ModelFamily::GptOss;
    let moe = match family {
        ModelFamily::Qwen2Moe
        | ModelFamily::Qwen3Moe
        | ModelFamily::Mixtral
        | ModelFamily::Olmoe
        | ModelFamily::GptOss
        | ModelFamily::Qwen35Moe
        | ModelFamily::Qwen3Next => {
            // llama.cpp's graphs fix whether the top-k weights are renormalised per family;
            // newer converters may say so in the file.
            let norm = file
                .get(&key("expert_weights_norm"))
                .and_then(GgufValue::as_bool)
                .unwrap_or(matches!(
                    family,
                    ModelFamily::Qwen3Moe
                        | ModelFamily::Mixtral
                        | ModelFamily::Qwen35Moe
                        | ModelFamily::Qwen3Next
                ));
            // A layer without a router has the dense MLP.
            let dense: Vec<bool> = (0..num_hidden_layers)
                .map(|i| {
                    file.tensor(&format!("blk.{i}.ffn_gate_inp.weight"))
                        .is_none()
                })
                .collect();
            Some(MoeConfig {
                num_experts: req("expert_count")?,
                num_experts_per_tok: req("expert_used_count")?,
                moe_intermediate_size: uint("expert_feed_forward_length")?
                    .unwrap_or(intermediate_size),
                // llama.cpp's gpt-oss graph: a softmax over the top logits.
                scoring: if gpt_oss {
                    RouterScoring::TopKThenSoftmax
                } else {
                    RouterScoring::SoftmaxThenTopK
                },
                norm_topk_prob: norm,
                shared_expert_intermediate_size: if file
                    .tensor("blk.0.ffn_up_shexp.weight")
                    .is_some()
                {
                    Some(req("expert_shared_feed_forward_length")?)
                } else {
                    None
                },
                dense_layers: MoeConfig::dense_layers_from(dense),
            })
        }
        _ => None,
    };
    let gemma = family.is_gemma();
    // Gemma 2's sliding layers: every other one from the first (llama.cpp's pattern of 2).
    // Gemma 3's sliding layers: llama.cpp reads the window from the file and fixes the rest
    // (five sliding layers to one global, a local RoPE base of 10,000). Phi-3's files name a
    // window too, which llama.cpp ignores ("Phi SWA is currently disabled"), as we do.
    // gpt-oss's: every other layer from the first (llama.cpp's default pattern of 2).
    let sliding_window = if gemma || gpt_oss {
        uint("attention.sliding_window")?
    } else {
        None
    };
    let pattern = if gpt_oss || family == ModelFamily::Gemma2 {
        2
    } else {
        6
    };
    let sliding_layers = match sliding_window {
        Some(_) => (0..num_hidden_layers)
            .map(|i| (i + 1) % pattern != 0)
            .collect(),
        None => Vec::new(),
    };
    let cfg = ModelConfig {
        architecture: arch.clone(),
        family,
        // llama.cpp's qwen2 graph adds the biases where the file has them.
        qkv_bias: file.tensor("blk.0.attn_q.bias").is_some(),
        o_bias_and_sinks: family.o_bias_and_sinks(),
        qk_norm: family.qk_norm(),
        sandwich_norms: gemma,
        hidden_act: if gemma {
            Activation::GeluTanh
        } else if gpt_oss {
            GPT_OSS_SWIGLU
        } else {
            Activation::Silu
        },
        embedding_multiplier: gemma.then(|| (hidden_size as f64).sqrt() as f32),
        // The converter stored Gemma's norm weights as 1 + w already.
        norm_weight_offset: 0.0,
        // Not in the file: llama.cpp scales by 1/√head_dim except for Gemma 2 and 3 27B
        // (46 and 62 layers), whose query_pre_attn_scalar is hidden / heads.
        query_pre_attn_scalar: gemma.then(|| {
            let layers_27b = if family == ModelFamily::Gemma2 {
                46
            } else {
                62
            };
            if num_hidden_layers == layers_27b {
                (hidden_size / num_attention_heads.max(1)) as f32
            } else {
                head_dim as f32
            }
        }),
        // Gemma 2's soft-capping, which its GGUF files always state.
        attn_logit_softcapping: float("attn_logit_softcapping"),
        final_logit_softcapping: float("final_logit_softcapping"),
        sliding_window,
        sliding_layers,
        rope_local_theta: (family == ModelFamily::Gemma3).then_some(10_000.0),
        vocab_size,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads: uint("attention.head_count_kv")?.unwrap_or(num_attention_heads),
        head_dim,
        rotary_dim,
        max_position_embeddings: uint("context_length")?.unwrap_or(2048),
        rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        rope_theta: float("rope.freq_base").unwrap_or(10000.0),
        rope_scaling,
        // GGUF files of tied models simply have no `output.weight`.
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        moe,
        linear_attention: if family.is_qwen35() {
            // Qwen3-Next's converter keeps the value heads grouped by key head; Qwen3.5's
            // reorders them tiled.
            let tiled = family != ModelFamily::Qwen3Next;
            Some(linear_attention_from_gguf(
                file,
                &arch,
                num_hidden_layers,
                tiled,
            )?)
        } else {
            None
        },
        attn_output_gate: family.is_qwen35(),
        gemma4: None,
    };
    cfg.validate()?;
    check_layer_count(file, cfg.num_hidden_layers)?;
    Ok(cfg)
}

/// The layer of a `blk.N.…` tensor.
pub(crate) fn layer_index(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// `block_count` must name every layer the file holds: fewer would silently drop layers
/// (and load a model that computes garbage), more fails later on a missing tensor.
fn check_layer_count(file: &GgufFile, block_count: usize) -> Result<(), LoadError> {
    let layers = file
        .tensors
        .iter()
        .filter_map(|t| layer_index(&t.name))
        .max()
        .map_or(0, |last| last + 1);
    if layers > block_count {
        return Err(LoadError::Config(format!(
            "block_count is {block_count} but the file holds {layers} layers (blk.0 to blk.{})",
            layers - 1
        )));
    }
    Ok(())
}

fn rope_scaling_from_gguf(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
    rotary_dim: usize,
) -> Result<RopeScaling, LoadError> {
    let factors = |name: &str| -> Result<Vec<f32>, LoadError> {
        let factors = file.dequantize(name)?;
        if factors.len() != rotary_dim / 2 {
            return Err(LoadError::Config(format!(
                "{name} has {} values, expected {}",
                factors.len(),
                rotary_dim / 2
            )));
        }
        Ok(factors)
    };
    // Llama 3.1-style scaling is baked by llama.cpp's converter into per-frequency divisors.
    if file.tensor("rope_freqs.weight").is_some() {
        return Ok(RopeScaling::FreqFactors(factors("rope_freqs.weight")?));
    }
    // Phi-3's LongRoPE: both sets of divisors as tensors, the scale of cosines and sines and
    // the original context in the metadata.
    if file.tensor("rope_factors_long.weight").is_some() {
        let num = |k: &str| file.get(&key(k)).and_then(GgufValue::as_f64);
        let original = num("rope.scaling.original_context_length")
            .or_else(|| num("context_length"))
            .unwrap_or(0.0) as usize;
        return Ok(RopeScaling::LongRope {
            short_factor: factors("rope_factors_short.weight")?,
            long_factor: factors("rope_factors_long.weight")?,
            original_max_position_embeddings: original,
            attention_factor: num("rope.scaling.attn_factor").unwrap_or(1.0) as f32,
        });
    }
    let kind = file
        .get(&key("rope.scaling.type"))
        .and_then(GgufValue::as_str);
    let factor = file
        .get(&key("rope.scaling.factor"))
        .and_then(GgufValue::as_f64)
        .map(|f| f as f32);
    let num = |k: &str| file.get(&key(k)).and_then(GgufValue::as_f64);
    match (kind, factor) {
        (None | Some("none"), _) => Ok(RopeScaling::None),
        (Some("linear"), Some(factor)) if factor > 0.0 => Ok(RopeScaling::Linear { factor }),
        // llama.cpp's YaRN: its `yarn_attn_factor` (1 unless the converter says) times the
        // paper's `0.1 ln(factor) + 1`, bounds rounded outwards.
        (Some("yarn"), Some(factor)) => Ok(RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: num("rope.scaling.original_context_length")
                .ok_or_else(|| {
                    LoadError::Config(format!(
                        "GGUF yarn rope scaling lacks {}",
                        key("rope.scaling.original_context_length")
                    ))
                })? as usize,
            beta_fast: num("rope.scaling.yarn_beta_fast").unwrap_or(32.0) as f32,
            beta_slow: num("rope.scaling.yarn_beta_slow").unwrap_or(1.0) as f32,
            attention_factor: (num("rope.scaling.yarn_attn_factor").unwrap_or(1.0)
                * crate::config::yarn_mscale(factor as f64, 1.0))
                as f32,
            truncate: true,
        }),
        (Some(other), _) => Err(LoadError::Config(format!(
            "unsupported GGUF rope scaling {other:?} (supported: none, linear, yarn, rope_freqs)"
        ))),
    }
}

/// GGUF tensors under Hugging Face names, dequantised to f32 on load.
pub struct GgufWeights<'a> {
    file: &'a GgufFile,
    /// Hugging Face name -> the GGUF tensor, or one expert's part of a 3-D tensor of
    /// experts (an info of its own, pointing at that part's bytes).
    names: HashMap<String, GgufTensorInfo>,
    num_heads: usize,
    num_kv_heads: usize,
    /// llama.cpp permutes q/k rows for its `llama` graph only (Qwen2's rotary pairs are
    /// already Hugging Face's halves).
    permuted_qk: bool,
}

impl<'a> GgufWeights<'a> {
    pub fn new(file: &'a GgufFile, config: &ModelConfig) -> Self {
        let mut names = HashMap::new();
        let experts_at = match config.family {
            ModelFamily::Gemma4 => "experts",
            _ => "mlp.experts",
        };
        for t in &file.tensors {
            if let Some((layer, proj, kind)) = merged_experts(&t.name) {
                // llama.cpp's `ffn_{gate,up,down}_exps`: `[experts, rows, cols]`, expert
                // after expert, each a whole matrix of whole blocks (gpt-oss's biases:
                // `[experts, rows]`).
                let shape = t.shape();
                // A count past what any configuration may name is not mapped (the load
                // then names the missing expert) rather than filling the map from a
                // hostile file's dimension.
                let experts = shape.first().copied().unwrap_or(0).max(1);
                let dims = if kind == "weight" { 3 } else { 2 };
                if shape.len() != dims || experts > MAX_EXPERTS {
                    continue;
                }
                let bytes = t.n_bytes() / experts as u64;
                // Gemma 4's gate and up in one tensor, each expert's gate rows then its up
                // rows: each half is whole rows of whole blocks.
                let projs: &[&str] = match proj {
                    "gate_up_proj" => &["gate_proj", "up_proj"],
                    _ => &[proj],
                };
                let mut dims = t.dims[..t.dims.len().saturating_sub(1)].to_vec();
                if let Some(rows) = dims.get_mut(1) {
                    *rows /= projs.len() as u64;
                }
                for e in 0..experts {
                    for (k, proj) in projs.iter().enumerate() {
                        let part = GgufTensorInfo {
                            name: format!("{}[{e}]{}", t.name, if k > 0 { "+" } else { "" }),
                            dims: dims.clone(),
                            ggml_type: t.ggml_type,
                            offset: t.offset
                                + e as u64 * bytes
                                + k as u64 * bytes / projs.len() as u64,
                        };
                        names.insert(
                            format!("model.layers.{layer}.{experts_at}.{e}.{proj}.{kind}"),
                            part,
                        );
                    }
                }
            } else if let Some(hf) = hf_name(&t.name, config.family) {
                names.insert(hf, t.clone());
            }
        }
        Self {
            file,
            names,
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_key_value_heads,
            permuted_qk: matches!(
                config.family,
                ModelFamily::Llama | ModelFamily::Mistral | ModelFamily::Mixtral
            ),
        }
    }
}

impl GgufWeights<'_> {
    fn info(&self, name: &str) -> Result<&GgufTensorInfo, LoadError> {
        self.names
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor(name.to_string()))
    }

    /// Undoes the converter's q/k row order (see [`unpermute_rows`]) on rows of any element.
    fn unpermuted<T: Copy + Default>(&self, info: &GgufTensorInfo, data: Vec<T>) -> Vec<T> {
        let rows = info.shape().first().copied().unwrap_or(0);
        if !self.permuted_qk {
            data
        } else if info.name.ends_with("attn_q.weight") {
            unpermute_rows(&data, rows, self.num_heads)
        } else if info.name.ends_with("attn_k.weight") {
            unpermute_rows(&data, rows, self.num_kv_heads)
        } else {
            data
        }
    }
}

impl WeightSource for GgufWeights<'_> {
    fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    fn tensor_shape(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        Ok(self.info(name)?.shape())
    }

    fn load(&self, name: &str) -> Result<Tensor, LoadError> {
        let info = self.info(name)?;
        // ggml lists dimensions fastest-varying first; PyTorch's order is the reverse.
        let shape = info.shape();
        let data = self.unpermuted(info, self.file.dequantize_tensor(info)?);
        self.file.release_tensor(info);
        Ok(Tensor { shape, data })
    }

    fn stored_half(&self, name: &str) -> Option<HalfKind> {
        match self.info(name).ok()?.ggml_type {
            GgmlType::F16 => Some(HalfKind::F16),
            GgmlType::BF16 => Some(HalfKind::BF16),
            _ => None,
        }
    }

    fn load_quantized(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
        let info = self.info(name)?;
        if !minivllm_kernels::qdot::has_dot(info.ggml_type) {
            return Ok(None);
        }
        let bytes = self.file.tensor_bytes(info);
        if bytes.len() as u64 != info.n_bytes() {
            return Err(LoadError::Config(format!(
                "tensor {}: its data runs past the end of the file",
                info.name
            )));
        }
        // Copied a run at a time, each run's mapped pages dropped once copied, so that a
        // large tensor is not resident twice (mapped and copied).
        let mut copy = Vec::with_capacity(bytes.len());
        for run in bytes.chunks(16 << 20) {
            copy.extend_from_slice(run);
            self.file
                .release_bytes(info, copy.len() - run.len(), run.len());
        }
        let data = self.unpermuted(info, copy);
        self.file.release_tensor(info);
        Ok(Some(QuantTensor {
            shape: info.shape(),
            ty: info.ggml_type,
            data,
        }))
    }
}

/// llama.cpp's converter reorders each head's q/k rows from rotate-half pairs `(i, i + d/2)`
/// to adjacent pairs `(2i, 2i + 1)`; this undoes it so one RoPE (rotate-half) serves both
/// formats. GGUF row `h*d + 2i + j` is Hugging Face row `h*d + j*d/2 + i`. Rows move whole,
/// so this works on f32 values and on a quantised row's bytes alike.
fn unpermute_rows<T: Copy + Default>(data: &[T], rows: usize, n_heads: usize) -> Vec<T> {
    let cols = data.len() / rows.max(1);
    let head_dim = rows / n_heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + 2 * i + j;
                let dst = h * head_dim + j * half + i;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_gemma_norms_by_their_place() {
        let gemma = |n: &str| hf_name(n, ModelFamily::Gemma3).unwrap();
        let llama = |n: &str| hf_name(n, ModelFamily::Llama).unwrap();
        // The norm before the MLP: LLaMA's post_attention_layernorm, Gemma's pre_feedforward.
        assert_eq!(
            llama("blk.1.ffn_norm.weight"),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(
            gemma("blk.1.ffn_norm.weight"),
            "model.layers.1.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            gemma("blk.1.post_attention_norm.weight"),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(
            gemma("blk.1.post_ffw_norm.weight"),
            "model.layers.1.post_feedforward_layernorm.weight"
        );
        assert_eq!(
            gemma("blk.1.attn_k_norm.weight"),
            "model.layers.1.self_attn.k_norm.weight"
        );
        assert_eq!(
            hf_name("blk.1.post_ffw_norm.weight", ModelFamily::Llama),
            None
        );
    }

    #[test]
    fn maps_llama_cpp_names() {
        assert_eq!(
            hf_name("blk.12.attn_q.weight", ModelFamily::Llama).unwrap(),
            "model.layers.12.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name("token_embd.weight", ModelFamily::Llama).unwrap(),
            "model.embed_tokens.weight"
        );
        assert_eq!(hf_name("blk.x.attn_q.weight", ModelFamily::Llama), None);
        assert_eq!(hf_name("rope_freqs.weight", ModelFamily::Llama), None);
    }

    #[test]
    fn maps_expert_names() {
        let name = |n: &str| hf_name(n, ModelFamily::Qwen2Moe);
        assert_eq!(
            name("blk.3.ffn_gate_inp.weight").unwrap(),
            "model.layers.3.mlp.gate.weight"
        );
        assert_eq!(
            name("blk.3.ffn_gate_inp_shexp.weight").unwrap(),
            "model.layers.3.mlp.shared_expert_gate.weight"
        );
        assert_eq!(
            name("blk.3.ffn_down_shexp.weight").unwrap(),
            "model.layers.3.mlp.shared_expert.down_proj.weight"
        );
        // Older Mixtral files: one tensor per expert.
        assert_eq!(
            hf_name("blk.0.ffn_up.7.weight", ModelFamily::Mixtral).unwrap(),
            "model.layers.0.mlp.experts.7.up_proj.weight"
        );
        assert_eq!(hf_name("blk.0.ffn_up.x.weight", ModelFamily::Mixtral), None);
        assert_eq!(hf_name("blk.0.ffn_up.7.bias", ModelFamily::Mixtral), None);
        // The 3-D tensors are split into experts by `GgufWeights::new`, not named here.
        assert_eq!(name("blk.0.ffn_gate_exps.weight"), None);
        assert_eq!(
            merged_experts("blk.12.ffn_down_exps.weight"),
            Some((12, "down_proj", "weight"))
        );
        // gpt-oss's expert biases, and its names for the rest.
        assert_eq!(
            merged_experts("blk.3.ffn_gate_exps.bias"),
            Some((3, "gate_proj", "bias"))
        );
        assert_eq!(merged_experts("blk.3.ffn_gate_exps.scale"), None);
        let oss = |n: &str| hf_name(n, ModelFamily::GptOss).unwrap();
        assert_eq!(
            oss("blk.1.attn_sinks.weight"),
            "model.layers.1.self_attn.sinks"
        );
        assert_eq!(
            oss("blk.1.attn_output.bias"),
            "model.layers.1.self_attn.o_proj.bias"
        );
        assert_eq!(
            oss("blk.1.ffn_gate_inp.bias"),
            "model.layers.1.mlp.gate.bias"
        );
        assert_eq!(
            oss("blk.1.post_attention_norm.weight"),
            "model.layers.1.post_attention_layernorm.weight"
        );
    }

    #[test]
    fn unpermute_inverts_the_converters_permutation() {
        // One head of dim 4, one column: HF rows [a0 a1 b0 b1] were stored as [a0 b0 a1 b1].
        let gguf = [10.0, 20.0, 11.0, 21.0];
        assert_eq!(unpermute_rows(&gguf, 4, 1), vec![10.0, 11.0, 20.0, 21.0]);
    }
}
