//! Reading a LLaMA-family model's weights into its layers: the config checked against the
//! weights' shapes, each tensor's tensor-parallel split, and one decoder layer's weights.

use crate::config::{LinearAttentionConfig, ModelConfig, QkNorm};
use crate::distributed::share;
use crate::model_executor::layers::fused_moe::{ExpertNames, FusedMoe};
use crate::model_executor::layers::gated_delta_net::{GatedDeltaNet, GatedDeltaNetConfig};
use crate::model_executor::layers::linear::Linear;
use crate::model_executor::layers::mlp::GatedMlp;
use crate::model_executor::layers::norm::RmsNorm;
use crate::model_executor::loader::fused::UnfusedSource;
use crate::model_executor::loader::sharded::{Rank, SplitDim};
use crate::model_executor::loader::weights::{LoadOptions, WeightSource};
use crate::model_executor::loader::LoadError;

use super::attention::LayerKv;
use super::mlp::{DenseAndMoe, Mlp};
use super::{DecoderLayer, Mixer, SelfAttention};
use crate::model_executor::layers::per_layer_input::PerLayerInputBlock;

/// Checks the sizes `config` gives against the shapes of the weights `src` holds (the whole
/// model's, before any split), naming the field that disagrees. A configuration is text that
/// anyone can edit and its sizes go on to size every buffer: a width, vocabulary or layer
/// count the weights do not back is refused before anything is allocated from it. `origin`
/// names the configuration in the error (its file).
pub fn check_config_against_weights(
    config: &ModelConfig,
    src: &dyn WeightSource,
    origin: &str,
) -> Result<(), LoadError> {
    let c = config;
    let src = &UnfusedSource::new(src, config);
    let h = ("hidden_size", c.hidden_size);
    let layer = |i: usize, s: &str| format!("model.layers.{i}.{s}");
    let is_linear = |i| c.linear_attention.as_ref().is_some_and(|l| l.is_linear(i));
    // The first layer with attention (Qwen3.5's first three are linear attention).
    let first = (0..c.num_hidden_layers)
        .find(|&i| !is_linear(i))
        .unwrap_or(0);
    let (heads, kv_heads, head_dim) = c.layer_attention(first);
    let q_rows = if c.attn_output_gate {
        (
            "2 × num_attention_heads × head_dim (q and its output gate)",
            2 * heads * head_dim,
        )
    } else {
        ("num_attention_heads × head_dim", heads * head_dim)
    };
    let mut expected = vec![
        (
            "model.embed_tokens.weight".to_string(),
            [("vocab_size", c.vocab_size), h],
        ),
        (layer(first, "self_attn.q_proj.weight"), [q_rows, h]),
        (
            layer(first, "self_attn.k_proj.weight"),
            [("num_key_value_heads × head_dim", kv_heads * head_dim), h],
        ),
    ];
    if let Some(linear) = &c.linear_attention {
        if let Some(i) = (0..c.num_hidden_layers).find(|&i| is_linear(i)) {
            expected.push((
                layer(i, "linear_attn.in_proj_qkv.weight"),
                [
                    ("the linear-attention q, k and v widths", linear.conv_dim()),
                    h,
                ],
            ));
        }
    }
    match &c.moe {
        Some(moe) if moe.is_moe_layer(0) => {
            let names = ExpertNames::find(src, 0);
            let [gate, ..] = names.expert(0);
            expected.push((names.router.clone(), [("num_experts", moe.num_experts), h]));
            expected.push((
                gate,
                [("moe_intermediate_size", moe.moe_intermediate_size), h],
            ));
            let [last, ..] = names.expert(moe.num_experts - 1);
            if !src.contains(&last) {
                return Err(LoadError::Config(format!(
                    "{origin}: num_experts {} but the weights hold no {last}",
                    moe.num_experts
                )));
            }
        }
        _ => expected.push((
            layer(0, "mlp.gate_proj.weight"),
            [("intermediate_size", c.intermediate_size), h],
        )),
    }
    for (tensor, dims) in expected {
        let shape = src.tensor_shape(&tensor)?;
        let wrong = dims
            .iter()
            .enumerate()
            .find(|&(i, &(_, value))| shape.len() != 2 || shape[i] != value);
        if let Some((_, &(field, value))) = wrong {
            return Err(LoadError::ConfigMismatch {
                origin: origin.to_string(),
                field,
                value,
                tensor,
                shape,
            });
        }
    }
    let last = c.num_hidden_layers - 1;
    let last = layer(
        last,
        if is_linear(last) {
            "linear_attn.in_proj_qkv.weight"
        } else {
            "self_attn.q_proj.weight"
        },
    );
    if !src.contains(&last) {
        return Err(LoadError::Config(format!(
            "{origin}: num_hidden_layers {} but the weights hold no {last}",
            c.num_hidden_layers
        )));
    }
    Ok(())
}

/// How tensor parallelism splits each LLaMA weight, all by output rows (norms stay whole on
/// every rank). With `kv_copies` the heads are split, each KV head held by that many ranks;
/// with `None` every rank holds every head's q/k/v.
pub(super) fn llama_split(name: &str, kv_copies: Option<usize>) -> Option<SplitDim> {
    const KV: [&str; 4] = [
        "k_proj.weight",
        "v_proj.weight",
        "k_proj.bias",
        "v_proj.bias",
    ];
    // gpt-oss's sinks go with their heads.
    const Q: [&str; 3] = ["q_proj.weight", "q_proj.bias", "self_attn.sinks"];
    // Experts split as the dense MLP does (Mixtral's w1/w3 are gate/up, w2 down); the
    // router and the shared expert's gate stay whole, and so do the biases of the
    // projections whose outputs are gathered before they are added (o, down).
    const ROWS: [&str; 11] = [
        "gate_proj.weight",
        "up_proj.weight",
        "gate_proj.bias",
        "up_proj.bias",
        "o_proj.weight",
        "down_proj.weight",
        "embed_tokens.weight",
        "lm_head.weight",
        "w1.weight",
        "w2.weight",
        "w3.weight",
    ];
    let ends = |names: &[&str]| names.iter().any(|s| name.ends_with(s));
    if ends(&KV) {
        kv_copies.map(|copies| SplitDim::SharedRows { copies })
    } else if ends(&Q) {
        kv_copies.map(|_| SplitDim::Rows)
    } else if ends(&ROWS) {
        Some(SplitDim::Rows)
    } else {
        None
    }
}

/// Layer `i` of rank `rank`: `whole` is the model's configuration, `c` the rank's part.
pub(super) fn load_layer(
    whole: &ModelConfig,
    c: &ModelConfig,
    rank: Rank,
    src: &dyn WeightSource,
    i: usize,
    opts: &LoadOptions,
) -> Result<DecoderLayer, LoadError> {
    let own_hidden = share(whole.hidden_size, rank.rank, rank.world_size).len();
    let p = format!("model.layers.{i}");
    let h = c.hidden_size;
    let name = |s: &str| format!("{p}.{s}");
    let (gate, up, down) = (
        name("mlp.gate_proj.weight"),
        name("mlp.up_proj.weight"),
        name("mlp.down_proj.weight"),
    );
    let optional_norm = |on: bool, s: &str, dim: usize| -> Result<Option<RmsNorm>, LoadError> {
        on.then(|| load_norm(c, src, &name(s), dim)).transpose()
    };
    let pre_mlp = if c.sandwich_norms {
        "pre_feedforward_layernorm.weight"
    } else {
        "post_attention_layernorm.weight"
    };
    let mixer = match &c.linear_attention {
        Some(linear) if linear.is_linear(i) => Mixer::Linear {
            net: GatedDeltaNet::load(src, &name("linear_attn"), &delta_config(c, linear), opts)?,
            state: (0..i).filter(|&j| linear.is_linear(j)).count(),
        },
        _ => Mixer::Attention(load_attention(whole, c, src, i, own_hidden, opts)?),
    };
    let dense = || {
        let width = whole.layer_intermediate_size(i);
        GatedMlp::load(
            src,
            [&gate, &up, &down],
            h,
            share(width, rank.rank, rank.world_size).len(),
            width,
            own_hidden,
            opts,
        )
    };
    let mlp = match (&c.moe, &whole.moe) {
        (Some(moe), Some(whole_moe)) if moe.is_moe_layer(i) => {
            let eps = c.gemma4.is_some().then_some(c.rms_norm_eps);
            let experts = FusedMoe::load(src, i, moe, whole_moe, h, own_hidden, eps, opts)?;
            if c.gemma4.is_some() {
                let norm = |s: &str| load_norm(c, src, &name(s), h);
                Mlp::DenseAndMoe(Box::new(DenseAndMoe {
                    dense: dense()?,
                    moe: experts,
                    post_dense: norm("post_feedforward_layernorm_1.weight")?,
                    pre_moe: norm("pre_feedforward_layernorm_2.weight")?,
                    post_moe: norm("post_feedforward_layernorm_2.weight")?,
                }))
            } else {
                Mlp::Moe(experts)
            }
        }
        _ => Mlp::Dense(dense()?),
    };
    let gemma4 = c.gemma4.as_ref();
    let per_layer_input = match gemma4.and_then(|g| g.per_layer_input) {
        Some(per_layer) => Some(PerLayerInputBlock::load(
            src,
            &p,
            h,
            per_layer.hidden,
            load_norm(c, src, &name("post_per_layer_input_norm.weight"), h)?,
            opts,
        )?),
        None => None,
    };
    // Gemma 4's checkpoints store a scale per layer (a buffer, 1 where it is left out).
    let scalar = name("layer_scalar");
    let layer_scalar = match gemma4 {
        Some(_) if src.contains(&scalar) => {
            Some(src.load(&scalar)?.expect_shape(&scalar, &[1])?[0])
        }
        _ => None,
    };
    Ok(DecoderLayer {
        input_layernorm: load_norm(c, src, &name("input_layernorm.weight"), h)?,
        mixer,
        post_attention_norm: optional_norm(c.sandwich_norms, "post_attention_layernorm.weight", h)?,
        pre_mlp_layernorm: load_norm(c, src, &name(pre_mlp), h)?,
        post_mlp_norm: optional_norm(c.sandwich_norms, "post_feedforward_layernorm.weight", h)?,
        mlp,
        per_layer_input,
        layer_scalar,
    })
}

/// The shape of a Gated DeltaNet layer of `c`.
fn delta_config(c: &ModelConfig, linear: &LinearAttentionConfig) -> GatedDeltaNetConfig {
    GatedDeltaNetConfig {
        hidden_size: c.hidden_size,
        heads: linear.heads(),
        conv_width: linear.conv_kernel_dim,
        rms_norm_eps: c.rms_norm_eps,
    }
}

/// Layer `i`'s attention (`whole` the model's configuration, `c` the rank's part).
fn load_attention(
    whole: &ModelConfig,
    c: &ModelConfig,
    src: &dyn WeightSource,
    i: usize,
    own_hidden: usize,
    opts: &LoadOptions,
) -> Result<SelfAttention, LoadError> {
    let p = format!("model.layers.{i}.self_attn");
    let h = c.hidden_size;
    let name = |s: &str| format!("{p}.{s}");
    let (heads, kv_heads, head_dim) = c.layer_attention(i);
    let whole_heads = whole.layer_attention(i).0;
    let (q_size, kv_size) = (heads * head_dim, kv_heads * head_dim);
    let kv = match (c.kv_source(i), &c.gemma4) {
        (Some(_), _) => LayerKv::Shared,
        (None, Some(g)) => LayerKv::Own {
            k_eq_v: g.k_eq_v && c.layer_window(i).is_none(),
        },
        (None, None) => LayerKv::Own { k_eq_v: false },
    };
    let (q, k, v) = (
        name("q_proj.weight"),
        name("k_proj.weight"),
        name("v_proj.weight"),
    );
    let optional_norm = |on: bool, s: &str, dim: usize| -> Result<Option<RmsNorm>, LoadError> {
        on.then(|| load_norm(c, src, &name(s), dim)).transpose()
    };
    let qkv_bias = if c.qkv_bias {
        let mut stacked = Vec::with_capacity(q_size + 2 * kv_size);
        for (bias, len) in [("q", q_size), ("k", kv_size), ("v", kv_size)] {
            let bias = name(&format!("{bias}_proj.bias"));
            stacked.extend(src.load(&bias)?.expect_shape(&bias, &[len])?);
        }
        Some(stacked)
    } else {
        None
    };
    let (q_norm_dim, k_norm_dim) = match c.qk_norm {
        QkNorm::Whole => (q_size, kv_size),
        _ => (head_dim, head_dim),
    };
    let own_kv = kv != LayerKv::Shared;
    let qk_norm = c.qk_norm != QkNorm::None;
    let (o_bias, sinks) = if c.o_bias_and_sinks {
        let (o, sinks) = (name("o_proj.bias"), name("sinks"));
        (
            Some(src.load(&o)?.expect_shape(&o, &[whole.hidden_size])?),
            Some(
                src.load(&sinks)?
                    .expect_shape(&sinks, &[c.num_attention_heads])?,
            ),
        )
    } else {
        (None, None)
    };
    let q_rows = q_size * if c.attn_output_gate { 2 } else { 1 };
    let parts: &[(&str, usize)] = match kv {
        LayerKv::Own { k_eq_v: false } => &[(&q, q_rows), (&k, kv_size), (&v, kv_size)],
        LayerKv::Own { k_eq_v: true } => &[(&q, q_rows), (&k, kv_size)],
        LayerKv::Shared => &[(&q, q_rows)],
    };
    Ok(SelfAttention {
        heads,
        kv_heads,
        head_dim,
        qkv_proj: Linear::load_merged(src, parts, h, opts)?,
        kv,
        v_norm: (c.gemma4.is_some() && own_kv).then(|| RmsNorm::unit(head_dim, c.rms_norm_eps)),
        qkv_bias,
        q_norm: optional_norm(qk_norm, "q_norm.weight", q_norm_dim)?,
        k_norm: optional_norm(qk_norm && own_kv, "k_norm.weight", k_norm_dim)?,
        o_proj: Linear::load(
            src,
            &name("o_proj.weight"),
            whole_heads * head_dim,
            own_hidden,
            opts,
        )?,
        o_bias,
        sinks,
        output_gate: c.attn_output_gate,
        window: c.layer_window(i),
    })
}

/// An RMSNorm of the model's kind (Gemma's weights are offsets from 1).
pub(super) fn load_norm(
    c: &ModelConfig,
    src: &dyn WeightSource,
    name: &str,
    dim: usize,
) -> Result<RmsNorm, LoadError> {
    Ok(RmsNorm::load(src, name, dim, c.rms_norm_eps)?.with_weight_offset(c.norm_weight_offset))
}
