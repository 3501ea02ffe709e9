//! Families read from GGUF files written here in llama.cpp's layout (its converter's tensor
//! names and `<arch>.*` keys) from the tiny models of `model_families.rs`: the configuration
//! llama.cpp would read, and transformers' logits (or the folder's, where llama.cpp's files
//! cannot say what the folder does).

use std::collections::BTreeMap;

use minivllm::config::{KvCacheLayout, LinearAttentionConfig, ModelConfig, RopeScaling};
use minivllm::model_executor::loader::gguf::{GgufFile, GgufValue};
use minivllm::model_executor::loader::gguf_weights::{config_from_gguf, GgufWeights};
use minivllm::model_executor::loader::gguf_writer::{write_gguf, TensorEntry};
use minivllm::model_executor::loader::weights::{LoadOptions, WeightSource};
use minivllm::model_executor::models::llama::LlamaForCausalLM;
use minivllm::worker::cache_engine::CacheEngine;
use minivllm::worker::model_runner::ModelRunner;
use minivllm_kernels::attention::KvCacheDtype;
use minivllm_kernels::quant::GgmlType;

use super::model_families::{assert_close, cases, step, BLOCK_SIZE};
use super::tiny_models::{self, TinyWeights};

/// A tensor as written: its GGUF name, its shape (outermost first) and its values.
pub(crate) type Tensor = (String, Vec<usize>, Vec<f32>);

/// `family`'s tiny weights under llama.cpp's names (`gguf_part` names each layer's tensors),
/// each passed through `adjust` (name, values) as llama.cpp's converter changes them;
/// routed experts left out (llama.cpp stacks them: [`stacked_experts`]).
fn tensors(
    family: &str,
    gguf_part: impl Fn(&str) -> &'static str,
    adjust: impl Fn(&str, &mut [f32]),
) -> Vec<Tensor> {
    let hf = TinyWeights::of(family);
    let gguf_name = |name: &str| -> String {
        let fixed = [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
        ];
        if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == name) {
            return g.to_string();
        }
        let rest = name.strip_prefix("model.layers.").unwrap();
        let (layer, part) = rest.split_once('.').unwrap();
        format!("blk.{layer}.{}", gguf_part(part))
    };
    hf.names()
        .filter(|name| !name.contains(".mlp.experts."))
        .map(|name| {
            let mut t = hf.load(name).unwrap();
            adjust(name, &mut t.data);
            (gguf_name(name), t.shape, t.data)
        })
        .collect()
}

/// Each layer's routed experts stacked as llama.cpp's converter writes them:
/// `blk.L.ffn_{gate,up,down}_exps.weight`, `[experts, rows, columns]`.
fn stacked_experts(family: &str, c: &ModelConfig) -> Vec<Tensor> {
    let hf = TinyWeights::of(family);
    let experts = c.moe.as_ref().map_or(0, |m| m.num_experts);
    let mut out = Vec::new();
    let routed = |layer: usize| c.moe.as_ref().is_some_and(|m| m.is_moe_layer(layer));
    for layer in (0..c.num_hidden_layers).filter(|&l| routed(l)) {
        for (proj, gguf) in [
            ("gate_proj", "ffn_gate_exps"),
            ("up_proj", "ffn_up_exps"),
            ("down_proj", "ffn_down_exps"),
        ] {
            let (mut shape, mut data) = (vec![experts], Vec::new());
            for e in 0..experts {
                let name = format!("model.layers.{layer}.mlp.experts.{e}.{proj}.weight");
                let t = hf.load(&name).unwrap();
                shape.truncate(1);
                shape.extend(t.shape);
                data.extend(t.data);
            }
            out.push((format!("blk.{layer}.{gguf}.weight"), shape, data));
        }
    }
    out
}

/// The `<arch>.*` keys every family's file has, from `c`, then `more`.
pub(crate) fn metadata(
    arch: &str,
    c: &ModelConfig,
    more: Vec<(&str, GgufValue)>,
) -> BTreeMap<String, GgufValue> {
    let u32_ = |v: usize| GgufValue::U32(v as u32);
    let common = vec![
        ("context_length", u32_(c.max_position_embeddings)),
        ("embedding_length", u32_(c.hidden_size)),
        ("feed_forward_length", u32_(c.intermediate_size)),
        ("block_count", u32_(c.num_hidden_layers)),
        ("attention.head_count", u32_(c.num_attention_heads)),
        ("attention.head_count_kv", u32_(c.num_key_value_heads)),
        (
            "attention.layer_norm_rms_epsilon",
            GgufValue::F32(c.rms_norm_eps),
        ),
        ("vocab_size", u32_(c.vocab_size)),
    ];
    std::iter::once((
        "general.architecture".to_string(),
        GgufValue::String(arch.into()),
    ))
    .chain(
        common
            .into_iter()
            .chain(more)
            .map(|(k, v)| (format!("{arch}.{k}"), v)),
    )
    .collect()
}

/// Writes `tensors` (f32) with `metadata` to a temporary GGUF file and opens it.
pub(crate) fn write(
    metadata: &BTreeMap<String, GgufValue>,
    tensors: &[Tensor],
) -> (tempfile::TempPath, GgufFile) {
    let entries: Vec<TensorEntry> = tensors
        .iter()
        .map(|(name, shape, _)| TensorEntry {
            name: name.clone(),
            // ggml lists dimensions innermost first.
            dims: shape.iter().rev().map(|&d| d as u64).collect(),
            ty: GgmlType::F32,
        })
        .collect();
    let path = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    write_gguf(&path, metadata, &entries, 32, |i| {
        Ok(tensors[i].2.iter().flat_map(|x| x.to_le_bytes()).collect())
    })
    .unwrap();
    let file = GgufFile::open(&path).unwrap();
    (path, file)
}

/// The last logits of `family`'s reference prompt `case` through the model `config` and
/// `src` load.
pub(crate) fn last_logits(
    family: &str,
    case: usize,
    config: &ModelConfig,
    src: &dyn WeightSource,
) -> Vec<f32> {
    let model = LlamaForCausalLM::load(config, src, &LoadOptions::FLOAT32).unwrap();
    let groups = KvCacheLayout::for_model(config).num_groups();
    let cache = CacheEngine::with_dtype(config, BLOCK_SIZE, 32 * groups, KvCacheDtype::Float32)
        .with_state_slots(config, 1);
    let mut runner = ModelRunner::new(model, cache);
    let prompt = &cases(family)[case].prompt;
    let out = step(&mut runner, &[(prompt, 0, prompt.len(), 0, false)]);
    out[0].1.clone()
}

/// Phi-3 (its converter's names and keys: q/k/v fused in `attn_qkv`, gate/up in `ffn_up`,
/// `rope_factors_long`/`_short` tensors, `phi3.rope.dimension_count`,
/// `phi3.rope.scaling.original_context_length` and `.attn_factor`) gives transformers'
/// logits. On a prompt within the window: llama.cpp ignores a Phi-3 file's sliding window,
/// and so does our GGUF reader.
#[test]
fn phi3_from_a_gguf_file_in_llama_cpp_layout_matches_transformers() {
    let config = tiny_models::config("phi3");
    let part = |part: &str| match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.qkv_proj.weight" => "attn_qkv.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "mlp.gate_up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        other => panic!("no GGUF name for {other}"),
    };
    let mut tensors = tensors("phi3", part, |_, _| {});
    let RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings,
        attention_factor,
    } = &config.rope_scaling
    else {
        panic!("the tiny Phi-3 has LongRoPE");
    };
    for (name, factors) in [
        ("rope_factors_long.weight", long_factor),
        ("rope_factors_short.weight", short_factor),
    ] {
        tensors.push((name.into(), vec![factors.len()], factors.clone()));
    }
    let u32_ = |v: usize| GgufValue::U32(v as u32);
    let c = &config;
    let more = vec![
        ("attention.sliding_window", u32_(16)),
        ("rope.dimension_count", u32_(c.rotary_dim)),
        ("rope.freq_base", GgufValue::F32(c.rope_theta)),
        (
            "rope.scaling.original_context_length",
            u32_(*original_max_position_embeddings),
        ),
        (
            "rope.scaling.attn_factor",
            GgufValue::F32(*attention_factor),
        ),
    ];
    let (_path, file) = write(&metadata("phi3", c, more), &tensors);
    let from_file = config_from_gguf(&file).unwrap();
    assert_eq!(
        (from_file.rotary_dim, from_file.sliding_window),
        (8, None),
        "rotary dims and (ignored) window"
    );
    assert_eq!(from_file.rope_scaling, config.rope_scaling);
    let case = &cases("phi3")[0];
    assert!(case.prompt.len() <= 16, "a prompt within the window");
    let weights = GgufWeights::new(&file, &from_file);
    let got = last_logits("phi3", 0, &from_file, &weights);
    let worst = assert_close(&got, &case.last_logits, "phi3 from GGUF");
    eprintln!("phi3 from a GGUF file: worst difference from transformers {worst:.2e}");
}

/// Gemma 2 (its names, norms stored as `1 + w`, the soft-caps and window in `gemma2.*`
/// keys): the configuration llama.cpp reads from it, and the same logits as the Hugging
/// Face folder given that configuration. (llama.cpp's files do not store
/// `query_pre_attn_scalar`, so the folder's 24 becomes head_dim's 32.)
#[test]
fn gemma2_from_a_gguf_file_in_llama_cpp_layout_matches_its_folder() {
    let mut config = tiny_models::config("gemma2");
    let part = |part: &str| match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        other => panic!("no GGUF name for {other}"),
    };
    // llama.cpp's converter adds Gemma's 1 into the norm weights.
    let tensors = tensors("gemma2", part, |name, data| {
        if name.ends_with("norm.weight") {
            data.iter_mut().for_each(|w| *w += 1.0);
        }
    });
    let u32_ = |v: usize| GgufValue::U32(v as u32);
    let more = vec![
        ("attention.key_length", u32_(config.head_dim)),
        ("attention.value_length", u32_(config.head_dim)),
        ("attention.sliding_window", u32_(16)),
        ("attn_logit_softcapping", GgufValue::F32(1.5)),
        ("final_logit_softcapping", GgufValue::F32(4.0)),
    ];
    let (_path, file) = write(&metadata("gemma2", &config, more), &tensors);
    let from_file = config_from_gguf(&file).unwrap();
    assert_eq!(
        (
            from_file.attn_logit_softcapping,
            from_file.final_logit_softcapping
        ),
        (Some(1.5), Some(4.0))
    );
    assert_eq!(from_file.sliding_window, Some(16));
    assert_eq!(from_file.sliding_layers, [true, false, true, false]);
    assert_eq!(from_file.query_pre_attn_scalar, Some(32.0));
    config.query_pre_attn_scalar = Some(32.0);
    // The 40-token prompt: past the window on the sliding layers.
    let from_gguf = last_logits(
        "gemma2",
        2,
        &from_file,
        &GgufWeights::new(&file, &from_file),
    );
    let from_folder = last_logits("gemma2", 2, &config, &TinyWeights::of("gemma2"));
    let worst = assert_close(&from_gguf, &from_folder, "gemma2 from GGUF");
    eprintln!("gemma2 from a GGUF file: worst difference from its folder {worst:.2e}");
}

/// Rows (or values) `(g, r)` of `x`, `[nk, rpk]` units of `unit` floats grouped by key head
/// `g`, reordered tiled, `[rpk, nk]`: llama.cpp's converter's `_reorder_v_heads`.
fn tile_v_heads(x: &mut [f32], nk: usize, rpk: usize, unit: usize) {
    let old = x.to_vec();
    for g in 0..nk {
        for r in 0..rpk {
            let (to, from) = ((r * nk + g) * unit, (g * rpk + r) * unit);
            x[to..to + unit].copy_from_slice(&old[from..from + unit]);
        }
    }
}

/// Qwen3.5 as llama.cpp's converter writes it (`qwen35`: the DeltaNet tensors as `ssm_*`,
/// `attn_qkv` and `attn_gate`; `−exp(A_log)` as `ssm_a`; the convolution's kernel 2-D; the
/// value heads reordered from grouped to tiled over the key heads; norms but the DeltaNet's
/// stored as 1 + w; the `ssm.*` and `attention.recurrent_layers` keys) gives transformers'
/// logits. With `MINIVLLM_KEEP_TINY_GGUF` set, the file is kept for
/// `scripts/check_tiny_gguf_layout.py`, which compares it with the converter's own.
#[test]
fn qwen35_from_a_gguf_file_in_llama_cpp_layout_matches_transformers() {
    qwen35_from_gguf("qwen35");
}

/// Qwen3.5-MoE likewise (`qwen35moe`): the experts stacked, the router as `ffn_gate_inp`,
/// the shared expert and its gate as `ffn_*_shexp`, the `expert_*` keys and no dense
/// `feed_forward_length`.
#[test]
fn qwen35moe_from_a_gguf_file_in_llama_cpp_layout_matches_transformers() {
    qwen35_from_gguf("qwen35moe");
}

/// Qwen3-Next (`qwen3next`): its fused `in_proj_qkvz` written as the converter cuts it
/// (`attn_qkv`, every q then every k then every v, and `attn_gate`), the value heads left
/// grouped, `in_proj_ba` as `ssm_ba` with b and a still interleaved per group.
#[test]
fn qwen3next_from_a_gguf_file_in_llama_cpp_layout_matches_transformers() {
    qwen35_from_gguf("qwen3next");
}

/// Qwen3-Next's `in_proj_qkvz` (`[q_g, k_g, v_g, z_g]` per key-head group `g`, rows of
/// `cols`) as the converter writes it: `attn_qkv` (every q, every k, every v) and `attn_gate`.
fn split_qkvz(data: &[f32], cols: usize, nk: usize, dk: usize, vz: usize) -> [Vec<f32>; 2] {
    let unit = (2 * dk + 2 * vz) * cols;
    let part = |from: usize, len: usize| -> Vec<f32> {
        (0..nk)
            .flat_map(|g| &data[g * unit + from * cols..g * unit + (from + len) * cols])
            .copied()
            .collect()
    };
    let qkv = [part(0, dk), part(dk, dk), part(2 * dk, vz)].concat();
    [qkv, part(2 * dk + vz, vz)]
}

fn qwen35_from_gguf(family: &str) {
    let config = tiny_models::config(family);
    let lin = config.linear_attention.clone().unwrap();
    let part = |part: &str| match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_qkvz.weight" => "attn_qkvz.weight",
        "linear_attn.in_proj_ba.weight" => "ssm_ba.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.A_log" => "ssm_a",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
        "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
        other => panic!("no GGUF name for {other}"),
    };
    let (nk, rpk) = (lin.num_key_heads, lin.num_value_heads / lin.num_key_heads);
    let (qk, vd, h) = (
        2 * nk * lin.key_head_dim,
        lin.value_head_dim,
        config.hidden_size,
    );
    let width = lin.conv_kernel_dim;
    let tiled = family != "qwen3next";
    let mut tensors = tensors(family, part, |name, data| {
        let leaf = name.rsplit_once("linear_attn.").map_or("", |(_, l)| l);
        match leaf {
            "A_log" if !tiled => data.iter_mut().for_each(|a| *a = -a.exp()),
            _ if !tiled && !leaf.is_empty() => {}
            "in_proj_qkv.weight" => tile_v_heads(&mut data[qk * h..], nk, rpk, vd * h),
            "in_proj_z.weight" => tile_v_heads(data, nk, rpk, vd * h),
            "in_proj_b.weight" | "in_proj_a.weight" => tile_v_heads(data, nk, rpk, h),
            "dt_bias" => tile_v_heads(data, nk, rpk, 1),
            "A_log" => {
                tile_v_heads(data, nk, rpk, 1);
                data.iter_mut().for_each(|a| *a = -a.exp());
            }
            "conv1d.weight" => tile_v_heads(&mut data[qk * width..], nk, rpk, vd * width),
            "out_proj.weight" => data
                .chunks_exact_mut(nk * rpk * vd)
                .for_each(|row| tile_v_heads(row, nk, rpk, vd)),
            _ if name.ends_with("norm.weight") && leaf.is_empty() => {
                data.iter_mut().for_each(|w| *w += 1.0)
            }
            _ => {}
        }
    });
    for t in tensors
        .iter_mut()
        .filter(|t| t.0.ends_with("ssm_conv1d.weight"))
    {
        t.1 = vec![t.1[0], t.1[2]];
    }
    // Each Qwen3-Next DeltaNet layer's fused q/k/v/z, cut as the converter cuts it.
    while let Some(i) = tensors
        .iter()
        .position(|t| t.0.ends_with("attn_qkvz.weight"))
    {
        let (name, shape, data) = tensors.remove(i);
        let [qkv, z] = split_qkvz(&data, shape[1], nk, lin.key_head_dim, rpk * vd);
        let layer = name.trim_end_matches("attn_qkvz.weight");
        let rows = |d: &Vec<f32>| d.len() / shape[1];
        tensors.push((
            format!("{layer}attn_gate.weight"),
            vec![rows(&z), shape[1]],
            z,
        ));
        tensors.push((
            format!("{layer}attn_qkv.weight"),
            vec![rows(&qkv), shape[1]],
            qkv,
        ));
    }
    tensors.extend(stacked_experts(family, &config));
    let u32_ = |v: usize| GgufValue::U32(v as u32);
    let mut more = vec![
        ("attention.key_length", u32_(config.head_dim)),
        ("attention.value_length", u32_(config.head_dim)),
        ("rope.dimension_count", u32_(config.rotary_dim)),
        ("rope.freq_base", GgufValue::F32(config.rope_theta)),
        (
            "rope.dimension_sections",
            GgufValue::Array([11, 11, 10, 0].map(GgufValue::I32).to_vec()),
        ),
        ("ssm.conv_kernel", u32_(width)),
        ("ssm.state_size", u32_(lin.key_head_dim)),
        ("ssm.group_count", u32_(nk)),
        ("ssm.time_step_rank", u32_(lin.num_value_heads)),
        ("ssm.inner_size", u32_(lin.num_value_heads * vd)),
        (
            "attention.recurrent_layers",
            GgufValue::Array(lin.layers.iter().map(|&l| GgufValue::Bool(l)).collect()),
        ),
        ("full_attention_interval", u32_(4)),
    ];
    if let Some(moe) = &config.moe {
        more.extend([
            ("expert_count", u32_(moe.num_experts)),
            ("expert_used_count", u32_(moe.num_experts_per_tok)),
            (
                "expert_feed_forward_length",
                u32_(moe.moe_intermediate_size),
            ),
            (
                "expert_shared_feed_forward_length",
                u32_(moe.shared_expert_intermediate_size.unwrap()),
            ),
        ]);
    }
    let mut metadata = metadata(family, &config, more);
    if family == "qwen35moe" {
        // The converter writes no dense width for Qwen3.5-MoE.
        metadata.remove(&format!("{family}.feed_forward_length"));
    }
    if !tiled {
        // Qwen3-Next's RoPE is plain NeoX, without the multimodal sections.
        metadata.remove(&format!("{family}.rope.dimension_sections"));
    }
    let (path, file) = write(&metadata, &tensors);
    if let Some(dir) = std::env::var_os("MINIVLLM_KEEP_TINY_GGUF") {
        let name = format!("{family}-f32.gguf");
        std::fs::copy(&path, std::path::Path::new(&dir).join(name)).unwrap();
    }
    let from_file = config_from_gguf(&file).unwrap();
    let want = ModelConfig {
        architecture: from_file.architecture.clone(),
        norm_weight_offset: 0.0,
        linear_attention: Some(LinearAttentionConfig {
            v_heads_tiled: tiled,
            ..lin
        }),
        ..config.clone()
    };
    assert_eq!(from_file, want, "the configuration read from the file");
    let weights = GgufWeights::new(&file, &from_file);
    for case in 0..3 {
        let got = last_logits(family, case, &from_file, &weights);
        let worst = assert_close(&got, &cases(family)[case].last_logits, family);
        eprintln!("{family} from a GGUF file, prompt {case}: worst difference {worst:.2e}");
    }
}
