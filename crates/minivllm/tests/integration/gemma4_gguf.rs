//! Gemma 4 read from GGUF files written here as llama.cpp's converter (b11434) writes them
//! (its names and `gemma4.*` keys, checked against the converter's output on these tiny
//! models): the configuration llama.cpp reads, and transformers' logits. The per-layer
//! widths go in arrays where layers differ, the proportional RoPE as a `rope_freqs` tensor,
//! keys as values as a full layer without `attn_v`, the experts' gate and up in one tensor.

use minivllm::config::ModelConfig;
use minivllm::model_executor::loader::gguf::GgufValue;
use minivllm::model_executor::loader::gguf_weights::{config_from_gguf, GgufWeights};
use minivllm::model_executor::loader::weights::WeightSource;

use super::family_gguf::{last_logits, metadata, write, Tensor};
use super::model_families::{assert_close, cases};
use super::tiny_models::{self, TinyWeights};

/// A Hugging Face tensor's GGUF name, as the converter renames it.
fn gguf_name(hf: &str) -> String {
    let global = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        (
            "model.embed_tokens_per_layer.weight",
            "per_layer_token_embd.weight",
        ),
        (
            "model.per_layer_model_projection.weight",
            "per_layer_model_proj.weight",
        ),
        (
            "model.per_layer_projection_norm.weight",
            "per_layer_proj_norm.weight",
        ),
    ];
    if let Some((_, g)) = global.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let (layer, part) = hf
        .strip_prefix("model.layers.")
        .unwrap()
        .split_once('.')
        .unwrap();
    let gguf = match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "layer_scalar" => "layer_output_scale.weight",
        "per_layer_input_gate.weight" => "inp_gate.weight",
        "per_layer_projection.weight" => "proj.weight",
        "post_per_layer_input_norm.weight" => "post_norm.weight",
        "router.proj.weight" => "ffn_gate_inp.weight",
        "router.scale" => "ffn_gate_inp.scale",
        "router.per_expert_scale" => "ffn_down_exps.scale",
        "experts.gate_up_proj" => "ffn_gate_up_exps.weight",
        "experts.down_proj" => "ffn_down_exps.weight",
        "pre_feedforward_layernorm_2.weight" => "pre_ffw_norm_2.weight",
        "post_feedforward_layernorm_1.weight" => "post_ffw_norm_1.weight",
        "post_feedforward_layernorm_2.weight" => "post_ffw_norm_2.weight",
        other => panic!("no GGUF name for {other}"),
    };
    format!("blk.{layer}.{gguf}")
}

/// `c`'s file: its tensors renamed, `rope_freqs`, and the keys the converter writes.
fn gemma4_file(family: &str, c: &ModelConfig) -> Vec<Tensor> {
    let hf = TinyWeights::of(family);
    let mut tensors: Vec<Tensor> = hf
        .names()
        .map(|name| {
            let t = hf.load(name).unwrap();
            (gguf_name(name), t.shape, t.data)
        })
        .collect();
    let g = c.gemma4.as_ref().unwrap();
    // One per frequency pair of the full layers' heads: 1 where it turns, 1e30 where not.
    let turning = g.full_head_dim / 8;
    let freqs = (0..g.full_head_dim / 2)
        .map(|i| if i < turning { 1.0 } else { 1e30 })
        .collect();
    tensors.push(("rope_freqs.weight".into(), vec![g.full_head_dim / 2], freqs));
    tensors
}

fn keys(c: &ModelConfig) -> Vec<(&'static str, GgufValue)> {
    let u32_ = |v: usize| GgufValue::U32(v as u32);
    let g = c.gemma4.as_ref().unwrap();
    let n = c.num_hidden_layers;
    // Arrays where the layers differ, as the converter writes them.
    let array = |f: &dyn Fn(usize) -> usize| {
        let v: Vec<usize> = (0..n).map(f).collect();
        if v.iter().all(|&x| x == v[0]) {
            u32_(v[0])
        } else {
            GgufValue::Array(v.iter().map(|&x| GgufValue::I32(x as i32)).collect())
        }
    };
    let sliding = (0..n)
        .map(|i| GgufValue::Bool(c.layer_window(i).is_some()))
        .collect();
    let mut k = vec![
        (
            "feed_forward_length",
            array(&|i| c.layer_intermediate_size(i)),
        ),
        (
            "attention.head_count_kv",
            array(&|i| c.layer_attention(i).1),
        ),
        ("attention.key_length", u32_(g.full_head_dim)),
        ("attention.value_length", u32_(g.full_head_dim)),
        ("attention.key_length_swa", u32_(c.head_dim)),
        ("attention.value_length_swa", u32_(c.head_dim)),
        ("attention.sliding_window", u32_(c.sliding_window.unwrap())),
        (
            "attention.sliding_window_pattern",
            GgufValue::Array(sliding),
        ),
        ("attention.shared_kv_layers", u32_(g.num_kv_shared_layers)),
        (
            "embedding_length_per_layer_input",
            u32_(g.per_layer_input.map_or(0, |p| p.hidden)),
        ),
        ("rope.freq_base", GgufValue::F32(c.rope_theta)),
        (
            "rope.freq_base_swa",
            GgufValue::F32(c.rope_local_theta.unwrap()),
        ),
        ("rope.dimension_count", u32_(g.full_head_dim)),
        ("rope.dimension_count_swa", u32_(c.head_dim)),
    ];
    if let Some(cap) = c.final_logit_softcapping {
        k.push(("final_logit_softcapping", GgufValue::F32(cap)));
    }
    if let Some(moe) = &c.moe {
        k.push(("expert_count", u32_(moe.num_experts)));
        k.push(("expert_used_count", u32_(moe.num_experts_per_tok)));
        k.push((
            "expert_feed_forward_length",
            u32_(moe.moe_intermediate_size),
        ));
    }
    k
}

/// Each tiny Gemma 4 (31B-like, E2B-like, 26B-A4B-like) from its file: the folder's
/// configuration, layer by layer, and transformers' logits on the 40-token prompt (past
/// the sliding layers' window of 16).
#[test]
fn gemma4_from_gguf_files_in_llama_cpp_layout_matches_transformers() {
    for family in ["gemma4", "gemma4e", "gemma4moe"] {
        let config = tiny_models::config(family);
        let mut meta = metadata("gemma4", &config, keys(&config));
        // The converter writes these per layer (above), and no vocab_size.
        meta.remove("gemma4.vocab_size");
        let (_path, file) = write(&meta, &gemma4_file(family, &config));
        let from_file = config_from_gguf(&file).unwrap_or_else(|e| panic!("{family}: {e}"));
        assert_eq!(from_file.gemma4, config.gemma4, "{family}");
        assert_eq!(from_file.moe, config.moe, "{family}");
        assert_eq!(from_file.rope_scaling, config.rope_scaling, "{family}");
        let layer = |c: &ModelConfig, i| {
            let shape = (c.layer_attention(i), c.kv_source(i));
            (shape, c.layer_intermediate_size(i), c.layer_window(i))
        };
        for i in 0..config.num_hidden_layers {
            assert_eq!(
                layer(&from_file, i),
                layer(&config, i),
                "{family} layer {i}"
            );
        }
        let weights = GgufWeights::new(&file, &from_file);
        let got = last_logits(family, 2, &from_file, &weights);
        let case = &cases(family)[2];
        let worst = assert_close(&got, &case.last_logits, &format!("{family} from GGUF"));
        eprintln!("{family} from a GGUF file: worst difference from transformers {worst:.2e}");
    }
}
