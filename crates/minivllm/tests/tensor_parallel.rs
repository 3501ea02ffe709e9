//! Tensor parallelism within one process: ranks as threads (`ThreadGroup`), each holding
//! its part of SmolLM2-135M (3 of its 9 heads, 1 of its 3 KV heads, a third of the MLP and
//! of the vocabulary), give the logits one process gives, and the same on every rank.

mod common;

use std::sync::Arc;

use minivllm::distributed::{Communicator, SingleProcess, ThreadGroup};
use minivllm::model_executor::input_metadata::InputMetadata;
use minivllm::model_executor::loader::gguf::GgufFile;
use minivllm::model_executor::loader::gguf_weights::{config_from_gguf, GgufWeights};
use minivllm::model_executor::loader::weights::LoadOptions;
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
        .forward(&input, cache.layers_mut(), BLOCK_SIZE, &mut buffers)
        .unwrap();
    input.clear();
    input.add_sequence(&tokens(30, 1), 30, &[0, 1], BLOCK_SIZE, false);
    input.add_sequence(&tokens(9, 3), 9, &[2], BLOCK_SIZE, false);
    input.add_sequence(&third[20..], 21, &[10, 11], BLOCK_SIZE, true);
    input.logits_indices.extend(0..39);
    model
        .forward(&input, cache.layers_mut(), BLOCK_SIZE, &mut buffers)
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

/// Runs the batch on one process and on three ranks: every rank must hold the same logits,
/// within `tol` of one process's, and pick the same greedy token wherever the best two are
/// more than `margin` apart.
fn check(opts: &LoadOptions, tol: f32, margin: f32) {
    minivllm::kernels::threading::init_threads(2);
    let alone = logits(opts, Arc::new(SingleProcess));
    let ranks = on_three_ranks(opts);
    for (r, logits) in ranks.iter().enumerate() {
        assert_eq!(logits, &ranks[0], "rank {r} differs from rank 0");
    }
    let worst = ranks[0]
        .iter()
        .zip(&alone)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("tensor parallel 3 vs 1 process: worst logit difference {worst:e}");
    assert!(worst < tol, "worst logit difference {worst}");
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

/// In f32 the ranks differ from one process only in the order of the row-parallel sums.
#[test]
fn three_ranks_match_one_process_in_f32() {
    check(&LoadOptions::FLOAT32, 2e-4, 0.0);
}

/// On quantised weights a sum's new order can move an activation across an 8-bit rounding
/// step, which later layers carry on: the ranks agree with one process to about a logit
/// (a wrong shard is off by tens) and in every greedy choice that is not a near-tie.
#[test]
fn three_ranks_match_one_process_on_the_quantised_file() {
    check(&LoadOptions::default(), 2.0, 1.0);
}

/// Every tensor of the shipped file, cut for each of 3 ranks in its blocks, dequantises to
/// the same cut of its f32 values.
#[test]
fn every_tensor_of_the_file_splits_along_whole_blocks() {
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
    let split = |n: &str| {
        Some(if n.contains("o_proj") || n.contains("down") {
            SplitDim::Cols
        } else {
            SplitDim::Rows
        })
    };
    for rank in 0..3 {
        let src = ShardedSource::new(
            &weights,
            Rank {
                rank,
                world_size: 3,
            },
            &split,
        );
        for name in &names {
            let f = src.load(name).unwrap();
            let q = src.load_quantized(name).unwrap().unwrap();
            assert_eq!(q.shape, f.shape, "{name}");
            let mut x = vec![0.0; f.data.len()];
            minivllm::kernels::quant::dequantize(q.ty, &q.data, &mut x).unwrap();
            assert_eq!(x, f.data, "{name} ({:?}) rank {rank}", q.ty);
        }
    }
}
