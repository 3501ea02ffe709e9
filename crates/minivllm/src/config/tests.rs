use super::model_family::ARCHITECTURES;
use super::*;
use serde_json::json;

fn base() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "vocab_size": 49152, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
        "tie_word_embeddings": true
    })
}

#[test]
fn reads_rope_theta_from_either_layout() {
    let mut v5 = base();
    v5["rope_parameters"] = json!({"rope_theta": 100000.0, "rope_type": "default"});
    let mut v4 = base();
    v4["rope_theta"] = json!(100000.0);
    for j in [v5, v4] {
        let c = ModelConfig::from_hf_json(&j).unwrap();
        assert_eq!(c.rope_theta, 100000.0);
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert_eq!(c.head_dim, 64);
    }
}

#[test]
fn reads_llama3_scaling() {
    let mut j = base();
    j["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let c = ModelConfig::from_hf_json(&j).unwrap();
    assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
}

#[test]
fn rejects_unknown_architecture_by_name() {
    let mut j = base();
    j["architectures"] = json!(["GPTNeoXForCausalLM"]);
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("GPTNeoXForCausalLM"), "{e}");
    // The message tells the user what would load instead.
    assert!(e.contains("Qwen2ForCausalLM") && e.contains("llama"), "{e}");
}

#[test]
fn qwen2_is_llama_with_qkv_bias() {
    let mut j = base();
    j["architectures"] = json!(["Qwen2ForCausalLM"]);
    let c = ModelConfig::from_hf_json(&j).unwrap();
    assert_eq!(
        (c.family, c.architecture.as_str(), c.qkv_bias),
        (ModelFamily::Qwen2, "qwen2", true)
    );
    j["architectures"] = json!(["LlamaForCausalLM"]);
    assert!(!ModelConfig::from_hf_json(&j).unwrap().qkv_bias);
    // Llama's attention_bias also biases o_proj, which is not held: refused, not ignored.
    j["attention_bias"] = json!(true);
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("attention_bias"), "{e}");
}

#[test]
fn gemma3_in_both_transformers_layouts() {
    // transformers 5: layer_types and rope parameters per layer type.
    let v5 = json!({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "vocab_size": 256, "query_pre_attn_scalar": 24, "sliding_window": 16,
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": null,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}
    });
    // transformers 4: a pattern and the local base at the top level.
    let mut v4 = v5.clone();
    let o = v4.as_object_mut().unwrap();
    for k in ["layer_types", "rope_parameters", "hidden_activation"] {
        o.remove(k);
    }
    o.insert("model_type".into(), json!("gemma3_text"));
    o.insert("architectures".into(), json!(null));
    o.insert("sliding_window_pattern".into(), json!(6));
    o.insert("rope_theta".into(), json!(1000000.0));
    o.insert("rope_local_base_freq".into(), json!(10000.0));
    for j in [v5, v4] {
        let c = ModelConfig::from_hf_json(&j).unwrap();
        assert_eq!(c.family, ModelFamily::Gemma3);
        assert_eq!(c.hidden_act, Activation::GeluTanh);
        assert!(c.qk_norm == QkNorm::PerHead && c.sandwich_norms && !c.qkv_bias);
        assert_eq!(
            (c.embedding_multiplier, c.norm_weight_offset),
            (Some(8.0), 1.0)
        );
        assert_eq!(c.attention_scale(), 1.0 / 24f32.sqrt());
        assert_eq!((c.rope_theta, c.rope_local_theta), (1e6, Some(1e4)));
        let windows: Vec<_> = (0..6).map(|i| c.layer_window(i)).collect();
        assert_eq!(
            windows,
            [Some(16), Some(16), Some(16), Some(16), Some(16), None]
        );
    }
}

#[test]
fn sliding_windows_follow_each_family() {
    let mut j = base();
    j["num_hidden_layers"] = json!(4);
    j["sliding_window"] = json!(4096);
    // Llama has none, whatever the field says.
    assert_eq!(ModelConfig::from_hf_json(&j).unwrap().layer_window(0), None);
    // Mistral v0.1: every layer.
    j["architectures"] = json!(["MistralForCausalLM"]);
    let c = ModelConfig::from_hf_json(&j).unwrap();
    assert!((0..4).all(|i| c.layer_window(i) == Some(4096)));
    // Qwen: only with use_sliding_window, from max_window_layers on.
    j["architectures"] = json!(["Qwen2ForCausalLM"]);
    j["max_window_layers"] = json!(2);
    assert_eq!(ModelConfig::from_hf_json(&j).unwrap().sliding_window, None);
    j["use_sliding_window"] = json!(true);
    let c = ModelConfig::from_hf_json(&j).unwrap();
    let windows: Vec<_> = (0..4).map(|i| c.layer_window(i)).collect();
    assert_eq!(windows, [None, None, Some(4096), Some(4096)]);
    // An activation the decoder does not have is refused, not run as SiLU.
    j["hidden_act"] = json!("relu");
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("relu"), "{e}");
}

#[test]
fn every_registered_name_resolves_and_is_listed() {
    for (gguf, hf, family) in ARCHITECTURES {
        assert_eq!(ModelFamily::from_name(gguf).unwrap(), *family);
        assert_eq!(ModelFamily::from_name(hf).unwrap(), *family);
        assert_eq!(family.gguf_name(), *gguf);
        assert!(
            supported_architectures().contains(hf),
            "{hf} missing from the message"
        );
    }
}

#[test]
fn rejects_inconsistent_heads() {
    let mut j = base();
    j["num_key_value_heads"] = json!(4);
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("not a multiple"), "{e}");
}

#[test]
fn rejects_values_that_would_compute_nan() {
    let cases: [(&str, Value); 7] = [
        ("rope_theta", json!(0.0)),
        ("rope_theta", json!(-10000.0)),
        ("rms_norm_eps", json!(0.0)),
        (
            "rope_scaling",
            json!({"rope_type": "linear", "factor": 0.0}),
        ),
        (
            "rope_scaling",
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        ),
        (
            "rope_scaling",
            json!({"rope_type": "llama3", "factor": -1.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        ),
        ("hidden_act", json!("gelu")),
    ];
    for (key, value) in cases {
        let mut j = base();
        j[key] = value.clone();
        let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
        let named = if key == "rope_scaling" {
            "rope scaling"
        } else {
            key
        };
        assert!(e.contains(named), "{key} = {value}: {e}");
    }
    // A NaN (not expressible in JSON) is caught by the same check.
    let mut cfg = ModelConfig::from_hf_json(&base()).unwrap();
    cfg.rms_norm_eps = f32::NAN;
    assert!(cfg
        .validate()
        .unwrap_err()
        .to_string()
        .contains("rms_norm_eps"));
}

#[test]
fn rejects_sizes_above_the_largest_supported() {
    for (key, value, needle) in [
        (
            "hidden_size",
            1u64 << 62,
            "hidden_size 4611686018427387904 is above",
        ),
        ("vocab_size", 1 << 40, "vocab_size 1099511627776 is above"),
        (
            "head_dim",
            1 << 13,
            "head_dim 8192 is above the largest supported (4096)",
        ),
        (
            "num_attention_heads",
            1 << 23,
            "num_attention_heads × head_dim",
        ),
    ] {
        let mut j = base();
        j["head_dim"] = json!(64);
        j[key] = json!(value);
        let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
        assert!(e.contains(needle), "{key}: {e}");
    }
    let mut j = base();
    j["vocab_size"] = json!(MAX_DIMENSION);
    ModelConfig::from_hf_json(&j).unwrap();
}

#[test]
fn rejects_unknown_rope_scaling() {
    let mut j = base();
    j["rope_scaling"] = json!({"type": "dynamic", "factor": 4.0});
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("dynamic"), "{e}");
    // YaRN needs the context it stretches.
    j["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(
        e.contains("yarn scaling needs original_max_position_embeddings"),
        "{e}"
    );
}

/// Qwen2.5's documented way to 128k (`rope_scaling` of type yarn, factor 4 over 32,768)
/// and DeepSeek's attention factor from `mscale` and `mscale_all_dim`.
#[test]
fn reads_yarn_scaling() {
    let mut j = base();
    j["rope_scaling"] = json!({"type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 32768});
    let c = ModelConfig::from_hf_json(&j).unwrap();
    let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        beta_fast,
        beta_slow,
        attention_factor,
        truncate,
    } = c.rope_scaling
    else {
        panic!("{:?}", c.rope_scaling);
    };
    assert_eq!(
        (
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate
        ),
        (4.0, 32768, 32.0, 1.0, true)
    );
    assert!((attention_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    j["rope_scaling"] = json!({"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
        "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "truncate": false});
    let c = ModelConfig::from_hf_json(&j).unwrap();
    assert_eq!(c.rope_scaling.attention_factor(), Some(1.0));
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Yarn {
            truncate: false,
            ..
        }
    ));
}

/// Phi-3-mini-128k's layout in transformers 4: `rope_scaling` of type `su` (LongRoPE's
/// first name), `original_max_position_embeddings` at the top level, the attention
/// factor derived from the two contexts; Phi-4-mini's partial rotary factor.
#[test]
fn reads_phi3_longrope_and_partial_rotary() {
    let mut j = base();
    j["architectures"] = json!(["Phi3ForCausalLM"]);
    j["max_position_embeddings"] = json!(131072);
    j["original_max_position_embeddings"] = json!(4096);
    j["sliding_window"] = json!(262144);
    j["partial_rotary_factor"] = json!(0.75);
    let factors = |x: f64| json!(vec![x; 24]);
    j["rope_scaling"] = json!({"type": "su", "short_factor": factors(1.0),
        "long_factor": factors(2.0)});
    let c = ModelConfig::from_hf_json(&j).unwrap();
    assert_eq!(c.family, ModelFamily::Phi3);
    assert_eq!((c.head_dim, c.rotary_dim), (64, 48));
    assert_eq!(c.sliding_layers, vec![true; 30]);
    let RopeScaling::LongRope {
        original_max_position_embeddings,
        attention_factor,
        long_factor,
        ..
    } = &c.rope_scaling
    else {
        panic!("{:?}", c.rope_scaling);
    };
    assert_eq!(
        (*original_max_position_embeddings, long_factor[0]),
        (4096, 2.0)
    );
    // sqrt(1 + ln(32) / ln(4096)), as transformers and llama.cpp's converter compute it.
    assert!(
        (attention_factor - 1.190_239).abs() < 1e-6,
        "{attention_factor}"
    );
    // Factors that do not match the rotary dims, or no original context, are refused.
    j["rope_scaling"]["long_factor"] = json!(vec![2.0; 32]);
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("long_factor has 32 values for 24"), "{e}");
    j["rope_scaling"]["long_factor"] = factors(2.0);
    j.as_object_mut()
        .unwrap()
        .remove("original_max_position_embeddings");
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("original_max_position_embeddings"), "{e}");
    // A rotary factor that would rotate nothing is refused.
    j["original_max_position_embeddings"] = json!(4096);
    j["partial_rotary_factor"] = json!(0.0);
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("partial_rotary_factor"), "{e}");
}

/// Gemma 4 E2B's text config as the hub's files write it (the full layers' shape at the top
/// level, no `layer_types`), cut to 12 layers.
fn gemma4_hub() -> serde_json::Value {
    json!({
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": {
            "model_type": "gemma4_text",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 12,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
            "global_head_dim": 32, "vocab_size": 256, "sliding_window": 512,
            "num_kv_shared_layers": 4, "use_double_wide_mlp": true,
            "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 256,
            "final_logit_softcapping": 30.0,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0}
            }
        }
    })
}

#[test]
fn gemma4_reads_its_layer_shapes_sharing_and_rope() {
    let c = ModelConfig::from_hf_json(&gemma4_hub()).unwrap();
    assert_eq!(c.family, ModelFamily::Gemma4);
    assert!(c.tie_word_embeddings && c.sandwich_norms && c.qk_norm == QkNorm::PerHead);
    assert_eq!((c.norm_weight_offset, c.attention_scale()), (0.0, 1.0));
    assert_eq!((c.rope_theta, c.rope_local_theta), (1e6, Some(1e4)));
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Proportional {
            fraction: 0.25,
            factor: 1.0
        }
    );
    // Five sliding to one full, the last layer full: layers 5 and 11 are full.
    let full: Vec<usize> = (0..12).filter(|&i| c.layer_window(i).is_none()).collect();
    assert_eq!(full, [5, 11]);
    assert_eq!(c.layer_attention(0), (4, 1, 16));
    // Without attention_k_eq_v the full layers keep the model's KV heads.
    assert_eq!(c.layer_attention(5), (4, 1, 32));
    assert_eq!(c.kv_slot_size(), 32);
    // Layers 8..12 share: the sliding ones read layer 7's K/V, the full one layer 5's.
    let sources: Vec<_> = (0..12).map(|i| c.kv_source(i)).collect();
    assert_eq!(&sources[..8], &[None; 8]);
    assert_eq!(&sources[8..], &[Some(7), Some(7), Some(7), Some(5)]);
    assert_eq!(
        (c.layer_intermediate_size(7), c.layer_intermediate_size(8)),
        (96, 192)
    );
    let g = c.gemma4.as_ref().unwrap();
    assert_eq!(
        g.per_layer_input,
        Some(crate::config::PerLayerInput {
            hidden: 8,
            vocab: 256
        })
    );
    // The shared layers keep no K/V of their own: 8 layers in the cache.
    let layout = KvCacheLayout::for_model(&c);
    assert_eq!(layout.place(8), layout.place(7));
    assert_eq!(layout.place(11), layout.place(5));
}

#[test]
fn gemma4_refuses_what_it_does_not_run() {
    let with = |k: &str, v: serde_json::Value| {
        let mut j = gemma4_hub();
        j["text_config"][k] = v;
        ModelConfig::from_hf_json(&j).unwrap_err().to_string()
    };
    // Experts without their counts.
    assert!(with("enable_moe_block", json!(true)).contains("lacks"));
    assert!(with("use_bidirectional_attention", json!("all")).contains("bidirectional"));
    assert!(with("num_kv_shared_layers", json!(12)).contains("no earlier layer"));
    assert!(with("per_layer_config", json!({"0": {"head_dim": 8}})).contains("full-attention"));
    assert!(
        with("per_layer_config", json!({"5": {"sliding_window": 8}})).contains("not supported")
    );
    assert!(with("global_head_dim", json!(0)).contains("global_head_dim"));
    let mut j = gemma4_hub();
    j["text_config"]["attention_k_eq_v"] = json!(true);
    j["text_config"]["num_global_key_value_heads"] = json!(3);
    let e = ModelConfig::from_hf_json(&j).unwrap_err().to_string();
    assert!(e.contains("do not fit 4 heads"), "{e}");
    // As transformers: the last layer attends fully, whatever `layer_types` says.
    let mut j = gemma4_hub();
    j["text_config"]["layer_types"] = json!(vec!["sliding_attention"; 12]);
    j["text_config"]["num_kv_shared_layers"] = json!(0);
    let c = ModelConfig::from_hf_json(&j).unwrap();
    assert_eq!((c.layer_window(10), c.layer_window(11)), (Some(512), None));
}

#[test]
fn gemma4_routes_experts_beside_its_mlp() {
    let mut j = gemma4_hub();
    let t = &mut j["text_config"];
    t["enable_moe_block"] = json!(true);
    t["num_experts"] = json!(8);
    t["top_k_experts"] = json!(2);
    t["moe_intermediate_size"] = json!(32);
    let c = ModelConfig::from_hf_json(&j).unwrap();
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.num_experts_per_tok,
            moe.moe_intermediate_size
        ),
        (8, 2, 32)
    );
    assert!(moe.norm_topk_prob && moe.shared_expert_intermediate_size.is_none());
    assert!((0..12).all(|i| moe.is_moe_layer(i)));
    assert_eq!(c.intermediate_size, 96);
}
