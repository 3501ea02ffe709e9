//! Mixture-of-Experts hyper-parameters: how many experts a layer holds, how many each token
//! goes to, their width, and which layers keep a dense MLP instead.

use serde_json::Value;

use super::{opt_usize, req_usize, ConfigError, ModelFamily, MAX_DIMENSION};
use crate::distributed::share;

/// A layer of routed experts in place of the MLP (vLLM's `FusedMoE`): a router picks
/// `num_experts_per_tok` of `num_experts` gated MLPs per token and sums their outputs,
/// weighted by the router's softmax probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    /// Each routed expert's MLP width (this rank's part with tensor parallelism).
    pub moe_intermediate_size: usize,
    /// How router logits become the chosen experts' weights.
    pub scoring: RouterScoring,
    /// Whether the top-k probabilities are divided by their sum (Qwen3-MoE, Mixtral) or
    /// used as the softmax over all experts gave them (Qwen2-MoE, OLMoE). Only for
    /// [`RouterScoring::SoftmaxThenTopK`]: the other's weights sum to one already.
    pub norm_topk_prob: bool,
    /// Qwen2-MoE's shared expert: a dense MLP of this width that every token runs, its
    /// output scaled by a sigmoid gate of its own (this rank's part).
    pub shared_expert_intermediate_size: Option<usize>,
    /// Layers whose MLP is dense, `[num_hidden_layers]` (Qwen's `mlp_only_layers` and
    /// `decoder_sparse_step`); empty when every layer has experts.
    pub dense_layers: Vec<bool>,
}

/// How a router's logits pick a token's experts and weigh them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterScoring {
    /// A softmax over every expert, then its `k` largest (Qwen-MoE, Mixtral, OLMoE).
    SoftmaxThenTopK,
    /// The `k` largest logits, then a softmax over those `k` (gpt-oss; llama.cpp's
    /// `SOFTMAX_WEIGHT` gating).
    TopKThenSoftmax,
}

/// The most experts a layer may hold and a token may use: today's largest models have 512
/// and use 10; more would only size buffers from a hostile configuration.
pub const MAX_EXPERTS: usize = 4096;

impl MoeConfig {
    /// [`Self::dense_layers`] from a flag per layer: empty when no layer is dense.
    pub(crate) fn dense_layers_from(dense: Vec<bool>) -> Vec<bool> {
        if dense.iter().any(|&d| d) {
            dense
        } else {
            Vec::new()
        }
    }

    /// Whether layer `i` routes its tokens to experts (else it has the dense MLP).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        !self.dense_layers.get(i).copied().unwrap_or(false)
    }

    pub(super) fn validate(&self, num_hidden_layers: usize) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if !(1..=MAX_EXPERTS).contains(&self.num_experts) {
            return bad(format!(
                "num_experts must be between 1 and {MAX_EXPERTS}, got {}",
                self.num_experts
            ));
        }
        if !(1..=self.num_experts).contains(&self.num_experts_per_tok) {
            return bad(format!(
                "num_experts_per_tok must be between 1 and num_experts ({}), got {}",
                self.num_experts, self.num_experts_per_tok
            ));
        }
        let widths = [
            ("moe_intermediate_size", Some(self.moe_intermediate_size)),
            (
                "shared_expert_intermediate_size",
                self.shared_expert_intermediate_size,
            ),
        ];
        for (name, width) in widths {
            if let Some(w) = width {
                if w == 0 || w > MAX_DIMENSION {
                    return bad(format!(
                        "{name} must be between 1 and {MAX_DIMENSION}, got {w}"
                    ));
                }
            }
        }
        if !self.dense_layers.is_empty() && self.dense_layers.len() != num_hidden_layers {
            return bad(format!(
                "{} dense-layer flags for {num_hidden_layers} layers",
                self.dense_layers.len()
            ));
        }
        Ok(())
    }

    /// Rank `rank`'s part out of `world_size`: each expert (and the shared one) split by
    /// its width, as vLLM's tensor parallelism splits experts.
    pub(crate) fn tensor_parallel_part(&self, rank: usize, world_size: usize) -> MoeConfig {
        MoeConfig {
            moe_intermediate_size: share(self.moe_intermediate_size, rank, world_size).len(),
            shared_expert_intermediate_size: self
                .shared_expert_intermediate_size
                .map(|w| share(w, rank, world_size).len()),
            ..self.clone()
        }
    }

    /// The experts of a Hugging Face `config.json`, `None` for a dense family.
    pub(super) fn from_hf(
        json: &Value,
        family: ModelFamily,
        num_hidden_layers: usize,
    ) -> Result<Option<Self>, ConfigError> {
        let flag =
            |key: &str, default: bool| json.get(key).and_then(Value::as_bool).unwrap_or(default);
        let cfg = match family {
            ModelFamily::Qwen2Moe | ModelFamily::Qwen3Moe | ModelFamily::Qwen3Next => {
                let step = opt_usize(json, "decoder_sparse_step")?.unwrap_or(1);
                if step == 0 {
                    return Err(ConfigError::Invalid(
                        "decoder_sparse_step must be positive".into(),
                    ));
                }
                let mlp_only = json
                    .get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_u64).collect::<Vec<_>>())
                    .unwrap_or_default();
                // transformers: experts where the layer is not listed and (i + 1) is a
                // multiple of the step.
                let dense: Vec<bool> = (0..num_hidden_layers)
                    .map(|i| mlp_only.contains(&(i as u64)) || !(i + 1).is_multiple_of(step))
                    .collect();
                let shared = if family != ModelFamily::Qwen3Moe {
                    opt_usize(json, "shared_expert_intermediate_size")?.filter(|&w| w > 0)
                } else {
                    None
                };
                MoeConfig {
                    num_experts: num_experts(json)?,
                    num_experts_per_tok: req_usize(json, "num_experts_per_tok")?,
                    moe_intermediate_size: req_usize(json, "moe_intermediate_size")?,
                    scoring: RouterScoring::SoftmaxThenTopK,
                    norm_topk_prob: flag("norm_topk_prob", false),
                    shared_expert_intermediate_size: shared,
                    dense_layers: MoeConfig::dense_layers_from(dense),
                }
            }
            // Every layer routes, and always renormalises its top k.
            ModelFamily::Qwen35Moe => MoeConfig {
                num_experts: num_experts(json)?,
                num_experts_per_tok: req_usize(json, "num_experts_per_tok")?,
                moe_intermediate_size: req_usize(json, "moe_intermediate_size")?,
                scoring: RouterScoring::SoftmaxThenTopK,
                norm_topk_prob: true,
                shared_expert_intermediate_size: opt_usize(
                    json,
                    "shared_expert_intermediate_size",
                )?
                .filter(|&w| w > 0),
                dense_layers: Vec::new(),
            },
            // Mixtral always renormalises; its experts are `intermediate_size` wide.
            ModelFamily::Mixtral => MoeConfig {
                num_experts: num_experts(json)?,
                num_experts_per_tok: req_usize(json, "num_experts_per_tok")?,
                moe_intermediate_size: req_usize(json, "intermediate_size")?,
                scoring: RouterScoring::SoftmaxThenTopK,
                norm_topk_prob: true,
                shared_expert_intermediate_size: None,
                dense_layers: Vec::new(),
            },
            ModelFamily::Olmoe => MoeConfig {
                num_experts: num_experts(json)?,
                num_experts_per_tok: req_usize(json, "num_experts_per_tok")?,
                moe_intermediate_size: req_usize(json, "intermediate_size")?,
                scoring: RouterScoring::SoftmaxThenTopK,
                norm_topk_prob: flag("norm_topk_prob", false),
                shared_expert_intermediate_size: None,
                dense_layers: Vec::new(),
            },
            ModelFamily::GptOss => MoeConfig {
                num_experts: num_experts(json)?,
                num_experts_per_tok: req_usize(json, "num_experts_per_tok")?,
                moe_intermediate_size: req_usize(json, "intermediate_size")?,
                scoring: RouterScoring::TopKThenSoftmax,
                norm_topk_prob: false,
                shared_expert_intermediate_size: None,
                dense_layers: Vec::new(),
            },
            // Gemma 4 (26B-A4B): experts beside every layer's dense MLP, always renormalised
            // (the layer also scales each expert's weight: `FusedMoe`'s Gemma 4 router).
            ModelFamily::Gemma4 if flag("enable_moe_block", false) => MoeConfig {
                num_experts: num_experts(json)?,
                num_experts_per_tok: req_usize(json, "top_k_experts")?,
                moe_intermediate_size: req_usize(json, "moe_intermediate_size")?,
                scoring: RouterScoring::SoftmaxThenTopK,
                norm_topk_prob: true,
                shared_expert_intermediate_size: None,
                dense_layers: Vec::new(),
            },
            _ => return Ok(None),
        };
        Ok(Some(cfg))
    }
}

/// The hub's configs say `num_experts` (Mixtral's `num_local_experts`); transformers 5
/// writes `num_local_experts` for every family.
fn num_experts(json: &Value) -> Result<usize, ConfigError> {
    match opt_usize(json, "num_experts")? {
        Some(n) => Ok(n),
        None => req_usize(json, "num_local_experts"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::config::{ModelConfig, ModelFamily, QkNorm};

    fn qwen2_moe() -> serde_json::Value {
        json!({
            "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
            "decoder_sparse_step": 2, "mlp_only_layers": [3]
        })
    }

    #[test]
    fn dense_layers_follow_the_step_and_the_list() {
        let c = ModelConfig::from_hf_json(&qwen2_moe()).unwrap();
        assert_eq!(c.family, ModelFamily::Qwen2Moe);
        assert!(c.qkv_bias);
        let moe = c.moe.unwrap();
        // Experts where (i + 1) is a multiple of 2 and i is not listed: layer 1 only.
        let sparse: Vec<bool> = (0..4).map(|i| moe.is_moe_layer(i)).collect();
        assert_eq!(sparse, [false, true, false, false]);
        assert_eq!(moe.shared_expert_intermediate_size, Some(48));
        assert!(!moe.norm_topk_prob);
    }

    #[test]
    fn each_family_names_its_experts_its_own_way() {
        // Mixtral: num_local_experts, experts as wide as intermediate_size, always
        // renormalised; transformers 5 also writes Qwen's count as num_local_experts.
        let mixtral = json!({
            "architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "num_local_experts": 8, "num_experts_per_tok": 2
        });
        let moe = ModelConfig::from_hf_json(&mixtral).unwrap().moe.unwrap();
        assert_eq!((moe.num_experts, moe.moe_intermediate_size), (8, 32));
        assert!(moe.norm_topk_prob && moe.dense_layers.is_empty());
        let mut qwen3 = qwen2_moe();
        qwen3["architectures"] = json!(["Qwen3MoeForCausalLM"]);
        qwen3["norm_topk_prob"] = json!(true);
        let o = qwen3.as_object_mut().unwrap();
        o.remove("num_experts");
        o.insert("num_local_experts".into(), json!(16));
        let c = ModelConfig::from_hf_json(&qwen3).unwrap();
        assert_eq!(c.qk_norm, QkNorm::PerHead);
        let moe = c.moe.unwrap();
        assert_eq!(moe.num_experts, 16);
        // Qwen3-MoE has no shared expert, whatever the config says.
        assert_eq!(moe.shared_expert_intermediate_size, None);
        assert!(moe.norm_topk_prob);
        let olmoe = json!({
            "model_type": "olmoe", "hidden_size": 64, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
            "num_experts": 8, "num_experts_per_tok": 2
        });
        let c = ModelConfig::from_hf_json(&olmoe).unwrap();
        assert_eq!((c.family, c.qk_norm), (ModelFamily::Olmoe, QkNorm::Whole));
        // A norm over every head's q at once keeps the heads whole on every rank.
        assert_eq!(c.attention_split(2), None);
    }

    #[test]
    fn impossible_expert_counts_are_refused() {
        for (key, value, needle) in [
            (
                "num_experts_per_tok",
                9,
                "num_experts_per_tok must be between 1 and num_experts (8)",
            ),
            (
                "num_experts_per_tok",
                0,
                "num_experts_per_tok must be between",
            ),
            ("num_experts", 0, "num_experts must be between 1 and 4096"),
            (
                "num_experts",
                1 << 20,
                "num_experts must be between 1 and 4096",
            ),
            (
                "moe_intermediate_size",
                0,
                "moe_intermediate_size must be between",
            ),
            (
                "decoder_sparse_step",
                0,
                "decoder_sparse_step must be positive",
            ),
        ] {
            let mut j = qwen2_moe();
            j[key] = json!(value);
            let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
            assert!(e.contains(needle), "{key} = {value}: {e}");
        }
        let mut j = qwen2_moe();
        j.as_object_mut().unwrap().remove("moe_intermediate_size");
        let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
        assert!(e.contains("config.json lacks moe_intermediate_size"), "{e}");
    }
}
