use std::collections::HashMap;

use minivllm_kernels::qdot::quantize_to;
use minivllm_kernels::quant::{dequantize, GgmlType};

use super::*;
use crate::distributed::{gather_columns, share, Communicator, ThreadGroup};
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
        "rows" | "gate" | "up" | "down" => Some(SplitDim::Rows),
        "kv" => Some(SplitDim::SharedRows { copies: 2 }),
        _ => None,
    }
}

/// The ranks' shards of each tensor, put back together, are the whole tensor: in f32 and
/// in its blocks, over rows that do not divide by the ranks.
#[test]
fn shards_put_back_together_are_the_tensor() {
    for ty in [None, Some(GgmlType::Q4_1), Some(GgmlType::Q6_K)] {
        let src = memory(&[
            ("rows", ty, 7, 768),
            ("whole", ty, 2, 256),
            ("kv", ty, 2, 256),
        ]);
        let world_size = 4;
        let shards: Vec<ShardedSource<'_>> = (0..world_size)
            .map(|rank| ShardedSource::new(&src, Rank { rank, world_size }, &by_name))
            .collect();
        let full = |name| src.load(name).unwrap().data;
        let parts: Vec<Tensor> = shards.iter().map(|s| s.load("rows").unwrap()).collect();
        let heights: Vec<usize> = parts.iter().map(|p| p.shape[0]).collect();
        assert_eq!(heights, [2, 2, 2, 1]);
        let rows: Vec<f32> = parts.into_iter().flat_map(|p| p.data).collect();
        assert_eq!(rows, full("rows"), "{ty:?}");
        assert_eq!(shards[1].load("whole").unwrap().data, full("whole"));
        // Two ranks hold each of the two KV rows whole.
        let kv: Vec<Vec<f32>> = shards.iter().map(|s| s.load("kv").unwrap().data).collect();
        assert_eq!((&kv[0], &kv[2]), (&kv[1], &kv[3]));
        assert_eq!([kv[0].clone(), kv[2].clone()].concat(), full("kv"));
        if let Some(ty) = ty {
            // The blocks are the file's own, cut, never re-quantised.
            let q = shards[3].load_quantized("rows").unwrap().unwrap();
            assert_eq!((q.ty, q.shape.as_slice()), (ty, &[1, 768][..]));
            let mut x = vec![0.0; 768];
            dequantize(ty, &q.data, &mut x).unwrap();
            assert_eq!(x, shards[3].load("rows").unwrap().data, "{ty:?}");
        }
    }
}

#[test]
fn shared_rows_that_do_not_divide_are_refused_by_name() {
    let e = Rank {
        rank: 0,
        world_size: 3,
    }
    .part("heads", 8)
    .unwrap_err()
    .to_string();
    assert!(e.contains("heads: 8 cannot be split over 3 ranks"), "{e}");
}

/// An MLP over three ranks (threads), each holding its rows of the quantised gate, up and
/// down projections (widths that do not divide by 3), with the activations' columns
/// gathered between them, gives what one process gives, to the bit.
#[test]
fn a_tensor_parallel_mlp_is_one_process_exactly() {
    let (hidden, inter, m) = (64, 800, 3);
    let src = memory(&[
        ("gate", Some(GgmlType::Q4_1), inter, hidden),
        ("up", Some(GgmlType::Q8_0), inter, hidden),
        ("down", Some(GgmlType::Q4_1), hidden, inter),
    ]);
    let x = values(m * hidden, 99);
    let mlp = |src: &dyn WeightSource, comm: &dyn Communicator| {
        let (rank, world) = (comm.rank(), comm.world_size());
        let (inter_part, hidden_part) = (
            share(inter, rank, world).len(),
            share(hidden, rank, world).len(),
        );
        let opts = LoadOptions::default();
        let load = |name, rows, cols| WeightMatrix::load_rows(src, &[(name, rows)], cols, &opts);
        let (gate, up) = (
            load("gate", inter_part, hidden).unwrap(),
            load("up", inter_part, hidden).unwrap(),
        );
        let down = load("down", hidden_part, inter).unwrap();
        let (mut g, mut u) = (vec![0.0; m * inter_part], vec![0.0; m * inter_part]);
        gate.matmul(&x, &mut g, m);
        up.matmul(&x, &mut u, m);
        let h: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let mut bufs = crate::distributed::GatherBuffers::default();
        let mut all_h = vec![0.0; m * inter];
        gather_columns(comm, None, &h, m, inter, &mut bufs, &mut all_h).unwrap();
        let mut part = vec![0.0; m * hidden_part];
        down.matmul(&all_h, &mut part, m);
        let mut out = vec![0.0; m * hidden];
        gather_columns(comm, None, &part, m, hidden, &mut bufs, &mut out).unwrap();
        out
    };
    minivllm_kernels::threading::init_threads(1);
    let alone = mlp(&src, &crate::distributed::SingleProcess);
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
                    mlp(&ShardedSource::new(src, rank, &by_name), comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, out) in results.iter().enumerate() {
        assert_eq!(out, &alone, "rank {r}");
    }
}
