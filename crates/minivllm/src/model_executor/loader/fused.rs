//! Checkpoints that store projections fused (Phi-3's `qkv_proj` and `gate_up_proj`, and
//! their GGUF `attn_qkv` and `ffn_up`) seen as the separate tensors the model loads. Each
//! part is a run of the fused tensor's rows, cut as it is read: a row is a run of whole
//! blocks, so a quantised file keeps its blocks, and tensor parallelism then cuts each part
//! as it cuts any other tensor (vLLM's `MergedColumnParallelLinear` split at load).

use std::collections::HashMap;
use std::ops::Range;

use minivllm_kernels::hmatmul::HalfKind;

use super::weights::{QuantTensor, Tensor, WeightSource};
use super::LoadError;
use crate::config::ModelConfig;

/// A weight source in which each fused tensor also answers for its parts.
pub struct UnfusedSource<'a> {
    inner: &'a dyn WeightSource,
    /// A part's name -> the fused tensor's name and the part's rows of it.
    parts: HashMap<String, (String, Range<usize>)>,
}

impl<'a> UnfusedSource<'a> {
    /// `inner` with the fusions it holds answered as their parts, for every layer of
    /// `config`: q, k and v (rows in that order) in `qkv_proj`, gate then up in
    /// `gate_up_proj` (Phi-3's). A checkpoint without them is passed through.
    pub fn new(inner: &'a dyn WeightSource, config: &ModelConfig) -> Self {
        let (q, kv, inter) = (config.q_size(), config.kv_size(), config.intermediate_size);
        let mut parts = HashMap::new();
        for i in 0..config.num_hidden_layers {
            let fusions: [(&str, &[(&str, usize)]); 2] = [
                (
                    "self_attn.qkv_proj",
                    &[
                        ("self_attn.q_proj", q),
                        ("self_attn.k_proj", kv),
                        ("self_attn.v_proj", kv),
                    ],
                ),
                (
                    "mlp.gate_up_proj",
                    &[("mlp.gate_proj", inter), ("mlp.up_proj", inter)],
                ),
            ];
            for (fused, split) in fusions {
                let fused = format!("model.layers.{i}.{fused}.weight");
                if !inner.contains(&fused) {
                    continue;
                }
                let mut start = 0;
                for &(part, rows) in split {
                    let part = format!("model.layers.{i}.{part}.weight");
                    parts.insert(part, (fused.clone(), start..start + rows));
                    start += rows;
                }
            }
        }
        Self { inner, parts }
    }

    /// The fused tensor and the rows of `name`, when `name` is a part of one.
    fn part(&self, name: &str) -> Option<&(String, Range<usize>)> {
        self.parts.get(name)
    }
}

/// The fused tensor's shape must hold every part's rows.
fn rows_of(
    name: &str,
    fused: &str,
    shape: &[usize],
    rows: &Range<usize>,
) -> Result<usize, LoadError> {
    match *shape {
        [total, cols] if rows.end <= total && total > 0 => Ok(cols),
        _ => Err(LoadError::Config(format!(
            "{fused} has shape {shape:?}, which does not hold {name} (its rows {rows:?})"
        ))),
    }
}

impl WeightSource for UnfusedSource<'_> {
    fn load(&self, name: &str) -> Result<Tensor, LoadError> {
        let Some((fused, rows)) = self.part(name) else {
            return self.inner.load(name);
        };
        let t = self.inner.load(fused)?;
        let cols = rows_of(name, fused, &t.shape, rows)?;
        Ok(Tensor {
            shape: vec![rows.len(), cols],
            data: t.data[rows.start * cols..rows.end * cols].to_vec(),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.part(name).is_some() || self.inner.contains(name)
    }

    fn tensor_shape(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        let Some((fused, rows)) = self.part(name) else {
            return self.inner.tensor_shape(name);
        };
        let shape = self.inner.tensor_shape(fused)?;
        let cols = rows_of(name, fused, &shape, rows)?;
        Ok(vec![rows.len(), cols])
    }

    fn load_quantized(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
        let Some((fused, rows)) = self.part(name) else {
            return self.inner.load_quantized(name);
        };
        let Some(t) = self.inner.load_quantized(fused)? else {
            return Ok(None);
        };
        let cols = rows_of(name, fused, &t.shape, rows)?;
        let row_bytes = cols / t.ty.block_size() * t.ty.type_size();
        Ok(Some(QuantTensor {
            shape: vec![rows.len(), cols],
            ty: t.ty,
            data: t.data[rows.start * row_bytes..rows.end * row_bytes].to_vec(),
        }))
    }

    fn stored_half(&self, name: &str) -> Option<HalfKind> {
        match self.part(name) {
            Some((fused, _)) => self.inner.stored_half(fused),
            None => self.inner.stored_half(name),
        }
    }
}
