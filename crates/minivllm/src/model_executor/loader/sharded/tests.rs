use std::collections::HashMap;

use minivllm_kernels::qdot::quantize_to;
use minivllm_kernels::quant::{dequantize, GgmlType};

use super::*;
use crate::distributed::{Communicator, ThreadGroup};
use crate::model_executor::layers::linear::WeightMatrix;
use crate::model_executor::loader::weights::LoadOptions;

/// A tensor's block format (`None`: f32), shape and values.
type Stored = (Option<GgmlType>, Vec<usize>, Vec<f32>);

/// Tensors held in memory, each stored in its format.
struct Memory(HashMap<&'static str, Stored>);

impl WeightSource for Memory {
    fn load(&self, name: &str) -> Result<Tensor, LoadError> {
        let (ty, shape, x) = &self.0[name];
        let data = match ty {
            Some(ty) => {
                let mut out = vec![0.0; x.len()];
                dequantize(*ty, &quantize_to(*ty, x).unwrap(), &mut out).unwrap();
                out
            }
            None => x.clone(),
        };
        Ok(Tensor {
            shape: shape.clone(),
            data,
        })
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
    fn load_quantized(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
        let (ty, shape, x) = &self.0[name];
        Ok(ty.map(|ty| QuantTensor {
            shape: shape.clone(),
            ty,
            data: quantize_to(ty, x).unwrap(),
        }))
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn memory(tensors: &[(&'static str, Option<GgmlType>, usize, usize)]) -> Memory {
    Memory(
        tensors
            .iter()
            .enumerate()
            .map(|(i, &(name, ty, rows, cols))| {
                (name, (ty, vec![rows, cols], values(rows * cols, i as u32)))
            })
            .collect(),
    )
}

fn by_name(name: &str) -> Option<SplitDim> {
    match name {
        "rows" | "gate" | "up" => Some(SplitDim::Rows),
        "cols" | "down" => Some(SplitDim::Cols),
        _ => None,
    }
}

/// The ranks' shards of each tensor, put back together, are the whole tensor: in f32 and
/// in its blocks.
#[test]
fn shards_put_back_together_are_the_tensor() {
    for ty in [None, Some(GgmlType::Q4_1), Some(GgmlType::Q6_K)] {
        let src = memory(&[
            ("rows", ty, 6, 768),
            ("cols", ty, 4, 768),
            ("whole", ty, 2, 256),
        ]);
        let world_size = 3;
        let shards: Vec<ShardedSource<'_>> = (0..world_size)
            .map(|rank| ShardedSource::new(&src, Rank { rank, world_size }, &by_name))
            .collect();
        let full = |name| src.load(name).unwrap().data;
        let rows: Vec<f32> = shards
            .iter()
            .flat_map(|s| s.load("rows").unwrap().data)
            .collect();
        assert_eq!(rows, full("rows"), "{ty:?}");
        let parts: Vec<Tensor> = shards.iter().map(|s| s.load("cols").unwrap()).collect();
        assert!(parts.iter().all(|p| p.shape == [4, 256]));
        let cols: Vec<f32> = (0..4)
            .flat_map(|r| {
                parts
                    .iter()
                    .flat_map(move |p| p.data[r * 256..(r + 1) * 256].to_vec())
            })
            .collect();
        assert_eq!(cols, full("cols"), "{ty:?}");
        assert_eq!(shards[1].load("whole").unwrap().data, full("whole"));
        if let Some(ty) = ty {
            // The blocks are the file's own, cut, never re-quantised.
            for (name, shape) in [("rows", [2, 768]), ("cols", [4, 256])] {
                let q = shards[2].load_quantized(name).unwrap().unwrap();
                assert_eq!((q.ty, q.shape.as_slice()), (ty, &shape[..]));
                let mut x = vec![0.0; shape[0] * shape[1]];
                dequantize(ty, &q.data, &mut x).unwrap();
                assert_eq!(x, shards[2].load(name).unwrap().data, "{name} {ty:?}");
            }
        }
    }
}

#[test]
fn a_split_that_would_cut_a_block_is_refused_by_name() {
    let src = memory(&[("cols", Some(GgmlType::Q4_K), 2, 512)]);
    let rank = Rank {
        rank: 0,
        world_size: 4,
    };
    let e = ShardedSource::new(&src, rank, &by_name)
        .load_quantized("cols")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tensor cols") && e.contains("units of 256"),
        "{e}"
    );
    let e = Rank {
        rank: 0,
        world_size: 3,
    }
    .part("heads", 8, 1)
    .unwrap_err()
    .to_string();
    assert!(e.contains("heads: 8 cannot be split over 3 ranks"), "{e}");
}

/// Megatron's MLP over three ranks (threads): gate and up column-parallel, down
/// row-parallel and an all-reduce, each rank holding a third of the quantised weights,
/// gives what one process gives.
#[test]
fn a_tensor_parallel_mlp_matches_one_process() {
    let (hidden, inter, m) = (64, 768, 3);
    let src = memory(&[
        ("gate", Some(GgmlType::Q4_1), inter, hidden),
        ("up", Some(GgmlType::Q8_0), inter, hidden),
        ("down", Some(GgmlType::Q4_1), hidden, inter),
    ]);
    let x = values(m * hidden, 99);
    let mlp = |src: &dyn WeightSource, inter: usize, comm: &dyn Communicator| {
        let opts = LoadOptions::default();
        let load = |name, rows, cols| WeightMatrix::load_rows(src, &[(name, rows)], cols, &opts);
        let (gate, up) = (
            load("gate", inter, hidden).unwrap(),
            load("up", inter, hidden).unwrap(),
        );
        let down = load("down", hidden, inter).unwrap();
        let (mut g, mut u) = (vec![0.0; m * inter], vec![0.0; m * inter]);
        gate.matmul(&x, &mut g, m);
        up.matmul(&x, &mut u, m);
        let h: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let mut out = vec![0.0; m * hidden];
        down.matmul(&h, &mut out, m);
        comm.all_reduce_sum(&mut out).unwrap();
        out
    };
    let alone = mlp(&src, inter, &crate::distributed::SingleProcess);
    let ranks = ThreadGroup::new(3);
    let results: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|comm| {
                let (src, mlp) = (&src, &mlp);
                s.spawn(move || {
                    let rank = Rank {
                        rank: comm.rank(),
                        world_size: 3,
                    };
                    mlp(&ShardedSource::new(src, rank, &by_name), inter / 3, comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Equal to one process up to the order of the down projection's sum, whose terms are
    // far larger than the result (f32 rounds each partial sum on its own scale).
    let scale = alone.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    for out in &results {
        assert_eq!(out, &results[0], "ranks differ");
        for (a, b) in out.iter().zip(&alone) {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "{a} vs {b} (outputs up to {scale})"
            );
        }
    }
}
