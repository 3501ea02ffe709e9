//! Tensor parallelism within one process: ranks as threads (`ThreadGroup`), each holding
//! its part of SmolLM2-135M (3 of its 9 heads, 1 of its 3 KV heads, a third of the MLP, of
//! the hidden width and of the vocabulary), give the logits one process gives: on quantised
//! weights to the bit, at any number of ranks, even or not.

use crate::common;

use std::sync::Arc;

use minivllm::config::{KvCacheLayout, ModelConfig};
use minivllm::distributed::{Communicator, SingleProcess, ThreadGroup};
use minivllm::model_executor::input_metadata::{InputMetadata, StateStep};
use minivllm::model_executor::loader::gguf::GgufFile;
use minivllm::model_executor::loader::gguf_weights::{config_from_gguf, GgufWeights};
use minivllm::model_executor::loader::weights::{LoadOptions, WeightSource};
use minivllm::model_executor::models::llama::{ForwardBuffers, LlamaForCausalLM};
use minivllm::worker::cache_engine::CacheEngine;

const BLOCK_SIZE: usize = 16;

/// Two prompts and a third sequence's decode step (its first 20 tokens computed first), in
/// one batch; logits for every position of the prompts and for the decode.
fn logits(opts: &LoadOptions, comm: Arc<dyn Communicator>) -> Vec<f32> {
    let gguf = GgufFile::open(&common::test_model_path()).unwrap();
    let config = config_from_gguf(&gguf).unwrap();
    let weights = GgufWeights::new(&gguf, &config);
    let model = LlamaForCausalLM::load_parallel(&config, &weights, opts, comm).unwrap();
    let mut cache = CacheEngine::new(model.local_config(), BLOCK_SIZE, 16);
    let mut buffers = ForwardBuffers::default();
    let tokens = |n: u32, from: u32| (0..n).map(|i| (from + 37 * i) % 49152).collect::<Vec<_>>();
    let third = tokens(21, 7);
    let mut input = InputMetadata::default();
    input.add_sequence(&third[..20], 20, &[10, 11], BLOCK_SIZE, false);
    model
        .forward(
            &input,
            cache.layers_mut(),
            &mut [],
            BLOCK_SIZE,
            &mut buffers,
        )
        .unwrap();
    input.clear();
    input.add_sequence(&tokens(30, 1), 30, &[0, 1], BLOCK_SIZE, false);
    input.add_sequence(&tokens(9, 3), 9, &[2], BLOCK_SIZE, false);
    input.add_sequence(&third[20..], 21, &[10, 11], BLOCK_SIZE, true);
    input.logits_indices.extend(0..39);
    model
        .forward(
            &input,
            cache.layers_mut(),
            &mut [],
            BLOCK_SIZE,
            &mut buffers,
        )
        .unwrap()
        .to_vec()
}

fn on_three_ranks(opts: &LoadOptions) -> Vec<Vec<f32>> {
    let ranks = ThreadGroup::new(3);
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|comm| s.spawn(move || logits(opts, Arc::new(comm))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs the batch on one process and on three ranks: rank 0 alone must hold the logits,
/// within `tol` of one process's (0: equal), and pick the same greedy token wherever the
/// best two are more than `margin` apart.
fn check(opts: &LoadOptions, tol: f32, margin: f32) {
    minivllm::kernels::threading::init_threads(2);
    let alone = logits(opts, Arc::new(SingleProcess));
    let ranks = on_three_ranks(opts);
    // Gathered on rank 0, which samples.
    assert_eq!(ranks[0].len(), alone.len());
    for (r, logits) in ranks.iter().enumerate().skip(1) {
        assert!(logits.is_empty(), "rank {r} holds logits");
    }
    let worst = ranks[0]
        .iter()
        .zip(&alone)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("tensor parallel 3 vs 1 process: worst logit difference {worst:e}");
    if tol == 0.0 {
        assert!(ranks[0] == alone, "logits differ by up to {worst}");
    }
    assert!(worst <= tol, "worst logit difference {worst}");
    let vocab = 49152;
    for (row, (tp, one)) in ranks[0]
        .chunks_exact(vocab)
        .zip(alone.chunks_exact(vocab))
        .enumerate()
    {
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| one[b].total_cmp(&one[a]));
        let best = (0..vocab).max_by(|&a, &b| tp[a].total_cmp(&tp[b])).unwrap();
        if one[order[0]] - one[order[1]] > margin {
            assert_eq!(best, order[0], "row {row}: greedy token differs");
        }
    }
}

/// In f32 too (SmolLM2's widths split by 3 into whole tiles of the f32 kernel; where a
/// rank's rows meet its tiles at other offsets, edge tiles sum in another order and the
/// ranks agree to rounding, as the random models below show at 3 ranks).
#[test]
fn three_ranks_are_one_process_in_f32() {
    check(&LoadOptions::FLOAT32, 0.0, 0.0);
}

/// On the file's quantised blocks every output is one process's dot product: the ranks'
/// logits are one process's, bit for bit.
#[test]
fn three_ranks_are_one_process_on_the_quantised_file() {
    check(&LoadOptions::default(), 0.0, 0.0);
}

/// Every tensor of the shipped file, cut by rows for each of 5 ranks (576 and 1,536 rows
/// do not divide by 5), keeps its blocks: they dequantise to the same cut of its values.
#[test]
fn every_tensor_of_the_file_splits_into_its_own_blocks() {
    use minivllm::model_executor::loader::sharded::{Rank, ShardedSource, SplitDim};
    use minivllm::model_executor::loader::weights::WeightSource;
    let gguf = GgufFile::open(&common::test_model_path()).unwrap();
    let config = config_from_gguf(&gguf).unwrap();
    let weights = GgufWeights::new(&gguf, &config);
    let names: Vec<String> = (0..2)
        .flat_map(|i| {
            [
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.o_proj",
                "mlp.down_proj",
                "mlp.up_proj",
            ]
            .map(|t| format!("model.layers.{i}.{t}.weight"))
        })
        .chain(["model.embed_tokens.weight".to_string()])
        .collect();
    let split = |_: &str| Some(SplitDim::Rows);
    for name in &names {
        let whole = weights.load(name).unwrap();
        let mut rows = Vec::new();
        for rank in 0..5 {
            let rank = Rank {
                rank,
                world_size: 5,
            };
            let src = ShardedSource::new(&weights, rank, &split);
            let f = src.load(name).unwrap();
            let q = src.load_quantized(name).unwrap().unwrap();
            assert_eq!(q.shape, f.shape, "{name}");
            let mut x = vec![0.0; f.data.len()];
            minivllm::kernels::quant::dequantize(q.ty, &q.data, &mut x).unwrap();
            assert_eq!(x, f.data, "{name} ({:?}) rank {rank:?}", q.ty);
            rows.extend(x);
        }
        assert_eq!(rows, whole.data, "{name}: the ranks' rows put together");
    }
}

/// A small LLaMA with random f32 weights: 8 heads of 8, `kv_heads` KV heads, 2 layers; as
/// `architecture` says, with Qwen2's q/k/v biases.
struct RandomLlama {
    config: minivllm::config::ModelConfig,
}

impl RandomLlama {
    fn new(kv_heads: usize) -> Self {
        Self::of("LlamaForCausalLM", kv_heads)
    }

    fn of(architecture: &str, kv_heads: usize) -> Self {
        let json = serde_json::json!({
            "architectures": [architecture],
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 8,
            "num_key_value_heads": kv_heads,
            "num_hidden_layers": 2,
            "vocab_size": 256,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 256,
            "tie_word_embeddings": false,
        });
        Self {
            config: minivllm::config::ModelConfig::from_hf_json(&json).unwrap(),
        }
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let c = &self.config;
        let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let kv = c.num_key_value_heads * c.head_dim;
        if let Some(tensor) = name.strip_suffix(".bias").filter(|_| c.qkv_bias) {
            return match tensor.rsplit('.').next()? {
                "q_proj" => Some(vec![h]),
                "k_proj" | "v_proj" => Some(vec![kv]),
                _ => None,
            };
        }
        let tensor = name.rsplit_once(".weight")?.0;
        let last = tensor.rsplit('.').next()?;
        Some(match last {
            "embed_tokens" | "lm_head" => vec![v, h],
            "q_proj" | "o_proj" => vec![h, h],
            "k_proj" | "v_proj" => vec![kv, h],
            "gate_proj" | "up_proj" => vec![i, h],
            "down_proj" => vec![h, i],
            "input_layernorm" | "post_attention_layernorm" | "norm" => vec![h],
            _ => return None,
        })
    }
}

impl minivllm::model_executor::loader::weights::WeightSource for RandomLlama {
    fn load(
        &self,
        name: &str,
    ) -> Result<
        minivllm::model_executor::loader::weights::Tensor,
        minivllm::model_executor::loader::LoadError,
    > {
        let shape = self
            .shape(name)
            .unwrap_or_else(|| panic!("no tensor {name}"));
        let seed = name
            .bytes()
            .fold(17u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
        let norm = name.ends_with("norm.weight");
        let data = (0..shape.iter().product::<usize>() as u32)
            .map(|i| {
                let x = ((i.wrapping_mul(2654435761) ^ seed).wrapping_mul(2246822519) >> 8) % 2001;
                let x = x as f32 / 1000.0 - 1.0;
                if norm {
                    1.0 + 0.1 * x
                } else {
                    0.2 * x
                }
            })
            .collect();
        Ok(minivllm::model_executor::loader::weights::Tensor { shape, data })
    }

    fn contains(&self, name: &str) -> bool {
        self.shape(name).is_some()
    }
}

/// Greedy ids of three prompts decoded together for 12 steps, and every step's logits (on
/// rank 0, which picks the tokens and sends them to the others, as the engine's driver does).
fn greedy_on(
    config: &ModelConfig,
    src: &dyn WeightSource,
    opts: &LoadOptions,
    comm: Arc<dyn Communicator>,
) -> (Vec<Vec<u32>>, Vec<f32>) {
    let model = LlamaForCausalLM::load_parallel(config, src, opts, comm).unwrap();
    let groups = KvCacheLayout::for_model(config).num_groups();
    // A state slot per sequence where the model has linear attention.
    let mut cache = CacheEngine::new(model.local_config(), BLOCK_SIZE, 8 * groups)
        .with_state_slots(model.local_config(), 3);
    let mut buffers = ForwardBuffers::default();
    let mut seqs: Vec<Vec<u32>> = vec![vec![1, 50, 7, 200, 33], vec![9; 17], vec![128, 3]];
    let mut all_logits = Vec::new();
    let (vocab, steps) = (config.vocab_size, 12);
    for step in 0..steps {
        let mut input = InputMetadata::with_groups(groups);
        for (s, ids) in seqs.iter().enumerate() {
            let new = if step == 0 {
                &ids[..]
            } else {
                &ids[ids.len() - 1..]
            };
            // Each group's table: two blocks of its own.
            let table: Vec<u32> = (0..groups as u32)
                .flat_map(|g| [g * 8 + 2 * s as u32, g * 8 + 2 * s as u32 + 1])
                .collect();
            input.add_sequence(new, ids.len(), &table, BLOCK_SIZE, true);
            if cache.num_state_slots() > 0 {
                input.states.push(StateStep::in_slot(s as u32));
            }
        }
        let (kv, states) = cache.caches_mut();
        let logits = model
            .forward(&input, kv, states, BLOCK_SIZE, &mut buffers)
            .unwrap();
        all_logits.extend_from_slice(logits);
        let mut picked: Vec<u8> = logits
            .chunks_exact(vocab)
            .map(|row| {
                (0..vocab)
                    .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                    .unwrap() as u8
            })
            .collect();
        model
            .communicator()
            .broadcast_bytes(0, &mut picked)
            .unwrap();
        for (ids, &best) in seqs.iter_mut().zip(&picked) {
            ids.push(best as u32);
        }
    }
    (seqs, all_logits)
}

fn greedy_on_ranks(
    config: &ModelConfig,
    src: &(dyn WeightSource + Sync),
    opts: &LoadOptions,
    world: usize,
) -> Vec<(Vec<Vec<u32>>, Vec<f32>)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ThreadGroup::new(world)
            .into_iter()
            .map(|comm| s.spawn(move || greedy_on(config, src, opts, Arc::new(comm))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// On a random LLaMA, greedy ids are the same at 1 to 4 ranks, with KV heads split (4 KV
/// heads), replicated on the ranks that share them (4 ranks over 2 KV heads), or not split
/// at all (3 ranks: every rank computes the 8 heads, and the widths split unevenly).
#[test]
fn a_random_llama_decodes_alike_on_one_to_four_ranks() {
    minivllm::kernels::threading::init_threads(2);
    for (architecture, kv_heads) in [
        ("LlamaForCausalLM", 4),
        ("LlamaForCausalLM", 2),
        ("Qwen2ForCausalLM", 2),
    ] {
        let llama = RandomLlama::of(architecture, kv_heads);
        let what = format!("random {architecture}, {kv_heads} KV heads");
        decodes_alike_on_one_to_four_ranks(&what, &llama.config, &llama);
    }
}

/// Greedy ids the same at 1 to 4 ranks; logits within 1e-4 of one process's in f32, and
/// equal to them with the weights quantised to Q4_0.
fn decodes_alike_on_one_to_four_ranks(
    what: &str,
    config: &ModelConfig,
    src: &(dyn WeightSource + Sync),
) {
    let quantised = LoadOptions {
        quantization: Some(minivllm::model_executor::loader::weights::Quantization::Q4_0),
        ..LoadOptions::default()
    };
    for (opts, tol) in [(LoadOptions::FLOAT32, 1e-4), (quantised, 0.0)] {
        decodes_alike_with(what, config, src, &opts, tol);
    }
}

fn decodes_alike_with(
    what: &str,
    config: &ModelConfig,
    src: &(dyn WeightSource + Sync),
    opts: &LoadOptions,
    tol: f32,
) {
    let what = format!("{what}, {:?}", opts.quantization);
    let (ids, logits) = greedy_on(config, src, opts, Arc::new(SingleProcess));
    for world in [2, 3, 4] {
        let ranks = greedy_on_ranks(config, src, opts, world);
        for (rank, (tp_ids, _)) in ranks.iter().enumerate() {
            assert_eq!(tp_ids, &ids, "{what}, {world} ranks: rank {rank}");
        }
        let tp_logits = &ranks[0].1;
        assert_eq!(tp_logits.len(), logits.len());
        let worst = tp_logits
            .iter()
            .zip(&logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("{what}, {world} ranks: worst logit difference {worst:e}");
        if tol == 0.0 {
            assert!(
                tp_logits == &logits,
                "{what}, {world} ranks: logits off by {worst}"
            );
        }
        assert!(
            worst <= tol.max(0.0),
            "{what}, {world} ranks: logits off by {worst}"
        );
    }
}

/// Qwen3's q/k norms and Gemma 3's norms, GeGLU, scaled embeddings and sliding windows
/// (prompts of 17 tokens decoded 12 steps cross its window of 16) split across ranks as
/// LLaMA's layers do: the tiny models of `model_families.rs`, whose 2 KV heads are
/// replicated at 4 ranks and not split at 3. Qwen3.5's DeltaNet layers run whole on every
/// rank (their weights are not split), its gated q projection split with its heads. Gemma
/// 4's attention runs whole on every rank (its full layers' KV heads are their own), its
/// MLPs (the double-wide ones too) and vocabulary split.
#[test]
fn every_family_decodes_alike_on_one_to_four_ranks() {
    minivllm::kernels::threading::init_threads(2);
    for family in [
        "llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen35", "gemma4", "gemma4e",
    ] {
        let config = super::tiny_models::config(family);
        let weights = super::tiny_models::TinyWeights::of(family);
        decodes_alike_on_one_to_four_ranks(family, &config, &weights);
    }
}

/// The Mixture-of-Experts families split as vLLM splits experts: each expert's width over
/// the ranks (8 experts of 32 rows: 11, 11 and 10 at 3 ranks), the router whole on every
/// rank; OLMoE's norm over the whole q keeps every head on every rank. gpt-oss's sinks go
/// with their heads (split at 2 and 4 ranks, whole at 3), its o and down biases are added
/// whole after the gathers, its gate/up biases split with their rows.
#[test]
fn moe_families_decode_alike_on_one_to_four_ranks() {
    minivllm::kernels::threading::init_threads(2);
    for family in [
        "qwen3moe",
        "qwen2moe",
        "mixtral",
        "olmoe",
        "gptoss",
        "qwen35moe",
        "gemma4moe",
    ] {
        let config = super::tiny_models::config(family);
        let weights = super::tiny_models::TinyWeights::of(family);
        decodes_alike_on_one_to_four_ranks(family, &config, &weights);
    }
}

/// Qwen2's q/k/v biases change what the model computes: the same weights with and without
/// them give other logits (a loader that dropped them would pass the test above).
#[test]
fn qwen2_biases_are_applied() {
    minivllm::kernels::threading::init_threads(2);
    let plain = RandomLlama::new(2);
    let f32 = &LoadOptions::FLOAT32;
    let (_, plain) = greedy_on(&plain.config, &plain, f32, Arc::new(SingleProcess));
    let qwen2 = RandomLlama::of("Qwen2ForCausalLM", 2);
    assert!(qwen2.config.qkv_bias);
    let (_, biased) = greedy_on(&qwen2.config, &qwen2, f32, Arc::new(SingleProcess));
    let moved = plain
        .iter()
        .zip(&biased)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(moved > 1e-2, "biases moved the logits by {moved} only");
}
