//! Checkpoints that store projections fused (Phi-3's `qkv_proj` and `gate_up_proj`, and
//! their GGUF `attn_qkv` and `ffn_up`) seen as the separate tensors the model loads. Each
//! part is a run of the fused tensor's rows, cut as it is read: a row is a run of whole
//! blocks, so a quantised file keeps its blocks, and tensor parallelism then cuts each part
//! as it cuts any other tensor (vLLM's `MergedColumnParallelLinear` split at load).
//! Qwen3-Next's Gated DeltaNet interleaves its parts per key-head group: `in_proj_qkvz`
//! holds, for each group, its q head, its k head, then its value heads' v and z rows, and
//! `in_proj_ba` its value heads' b then a rows; each part (Qwen3.5's `in_proj_qkv` — every
//! q, then every k, then every v —, `in_proj_z`, `in_proj_b`, `in_proj_a`) is several runs.
//!
//! gpt-oss's checkpoints stack a layer's experts in four tensors, `mlp.experts.gate_up_proj`
//! `[experts, hidden, 2 * width]` (transposed, gate and up interleaved along the last axis:
//! gate row `j` is column `2j`, up row `j` column `2j + 1`), `gate_up_proj_bias`
//! `[experts, 2 * width]` (interleaved the same way), `down_proj` `[experts, width, hidden]`
//! (transposed) and `down_proj_bias` `[experts, hidden]`: each expert's projections and
//! biases are answered under the per-expert names the other families use
//! (`mlp.experts.E.gate_proj.weight`, `.bias`), one expert's slice read at a time. The
//! released checkpoints hold the projections in MXFP4 instead, as `gate_up_proj_blocks`
//! `[experts, 2 * width, hidden / 32, 16]` (output rows first, gate and up interleaved by
//! row) and `gate_up_proj_scales` `[experts, 2 * width, hidden / 32]` (E8M0), `down_proj_*`
//! alike: each expert's rows are answered as ggml's MXFP4 blocks (its scale byte, then its
//! nibbles in ggml's order), which the kernels compute on as they are. Gemma 4's stack theirs
//! untransposed beside the MLP, `experts.gate_up_proj` `[experts, 2 * width, hidden]` (the
//! gate rows, then the up rows) and `experts.down_proj` `[experts, hidden, width]`.

use std::collections::HashMap;
use std::ops::Range;

use minivllm_kernels::hmatmul::HalfKind;

use super::weights::{QuantTensor, Tensor, WeightSource};
use super::LoadError;
use crate::config::ModelConfig;

/// A weight source in which each fused tensor also answers for its parts.
pub struct UnfusedSource<'a> {
    inner: &'a dyn WeightSource,
    /// A part's name -> the fused tensor's name, the part's rows of it (runs, in order),
    /// and the rows of all its parts together (what the fused tensor must have).
    parts: HashMap<String, (String, Vec<Range<usize>>, usize)>,
    /// An expert's tensor -> the stacked tensor, the expert, and which part of it.
    experts: HashMap<String, (String, usize, StackedPart)>,
    /// The experts the config names: what each stacked tensor must hold.
    num_experts: usize,
}

/// One expert's tensor within gpt-oss's stacked ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StackedPart {
    /// Gate (`0`) or up (`1`) rows of `gate_up_proj`: its columns of that parity, transposed.
    GateUp(usize),
    /// Gate or up of `gate_up_proj_bias`: its values of that parity.
    GateUpBias(usize),
    /// `down_proj`, transposed.
    Down,
    /// `down_proj_bias` as it is.
    DownBias,
    /// Gate or up rows (that parity's) of `gate_up_proj_blocks`/`_scales`, as MXFP4.
    GateUpMxfp4(usize),
    /// `down_proj_blocks`/`_scales` as MXFP4.
    DownMxfp4,
    /// Gemma 4's: the gate (`0`) or up (`1`) half of `gate_up_proj`'s rows.
    GateUpRows(usize),
    /// Gemma 4's `down_proj` as it is.
    DownRows,
}

impl StackedPart {
    /// The expert's tensor from its slice of the stacked one (shape without the experts).
    fn cut(self, name: &str, t: Tensor) -> Result<Tensor, LoadError> {
        let bad = || {
            LoadError::Config(format!(
                "{name}: the stacked tensor's slice has shape {:?}",
                t.shape
            ))
        };
        Ok(match (self, t.shape.as_slice()) {
            (StackedPart::GateUp(parity), &[hidden, two_width]) if two_width % 2 == 0 => {
                let width = two_width / 2;
                let mut data = vec![0.0; width * hidden];
                for (h, row) in t.data.chunks_exact(two_width).enumerate() {
                    for j in 0..width {
                        data[j * hidden + h] = row[2 * j + parity];
                    }
                }
                Tensor {
                    shape: vec![width, hidden],
                    data,
                }
            }
            (StackedPart::GateUpBias(parity), &[two_width]) if two_width % 2 == 0 => Tensor {
                shape: vec![two_width / 2],
                data: t.data.iter().skip(parity).step_by(2).copied().collect(),
            },
            (StackedPart::Down, &[width, hidden]) => {
                let mut data = vec![0.0; width * hidden];
                for (j, row) in t.data.chunks_exact(hidden).enumerate() {
                    for (h, &x) in row.iter().enumerate() {
                        data[h * width + j] = x;
                    }
                }
                Tensor {
                    shape: vec![hidden, width],
                    data,
                }
            }
            (StackedPart::DownBias, &[_]) | (StackedPart::DownRows, &[_, _]) => t,
            (StackedPart::GateUpRows(half), &[two_width, hidden]) if two_width % 2 == 0 => {
                let len = two_width / 2 * hidden;
                Tensor {
                    shape: vec![two_width / 2, hidden],
                    data: t.data[half * len..(half + 1) * len].to_vec(),
                }
            }
            (StackedPart::GateUpMxfp4(_) | StackedPart::DownMxfp4, _) => {
                unreachable!("MXFP4 parts are read as blocks")
            }
            _ => return Err(bad()),
        })
    }

    /// The expert's tensor's shape from the stacked tensor's.
    fn shape(self, stacked: &[usize]) -> Option<Vec<usize>> {
        Some(match (self, stacked) {
            (StackedPart::GateUp(_), &[_, hidden, two_width]) if two_width % 2 == 0 => {
                vec![two_width / 2, hidden]
            }
            (StackedPart::GateUpBias(_), &[_, two_width]) if two_width % 2 == 0 => {
                vec![two_width / 2]
            }
            (StackedPart::Down, &[_, width, hidden]) => vec![hidden, width],
            (StackedPart::DownBias, &[_, hidden]) => vec![hidden],
            (StackedPart::GateUpRows(_), &[_, two_width, hidden]) if two_width % 2 == 0 => {
                vec![two_width / 2, hidden]
            }
            (StackedPart::DownRows, &[_, hidden, width]) => vec![hidden, width],
            (StackedPart::GateUpMxfp4(_), &[_, two_width, nb, 16]) if two_width % 2 == 0 => {
                vec![two_width / 2, nb * 32]
            }
            (StackedPart::DownMxfp4, &[_, rows, nb, 16]) => vec![rows, nb * 32],
            _ => return None,
        })
    }
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
                let total: usize = split.iter().map(|&(_, rows)| rows).sum();
                let mut start = 0;
                for &(part, rows) in split {
                    let part = format!("model.layers.{i}.{part}.weight");
                    let runs = std::iter::once(start..start + rows).collect();
                    parts.insert(part, (fused.clone(), runs, total));
                    start += rows;
                }
            }
            if let Some(lin) = &config.linear_attention {
                let p = format!("model.layers.{i}.linear_attn");
                for (fused, split) in delta_net_groups(lin) {
                    let fused = format!("{p}.{fused}.weight");
                    if !inner.contains(&fused) {
                        continue;
                    }
                    let total = split.iter().flat_map(|(_, r)| r).map(|r| r.len()).sum();
                    for (part, runs) in split {
                        parts.insert(format!("{p}.{part}.weight"), (fused.clone(), runs, total));
                    }
                }
            }
        }
        let mut experts = HashMap::new();
        let num_experts = config.moe.as_ref().map_or(0, |m| m.num_experts);
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}.experts");
            let gemma4 = [
                (
                    "gate_up_proj",
                    "gate_proj.weight",
                    StackedPart::GateUpRows(0),
                ),
                ("gate_up_proj", "up_proj.weight", StackedPart::GateUpRows(1)),
                ("down_proj", "down_proj.weight", StackedPart::DownRows),
            ];
            for (from, to, part) in gemma4 {
                let from = format!("{p}.{from}");
                if inner.contains(&from) {
                    for e in 0..num_experts {
                        experts.insert(format!("{p}.{e}.{to}"), (from.clone(), e, part));
                    }
                }
            }
            let p = format!("model.layers.{i}.mlp.experts");
            let mxfp4 = inner.contains(&format!("{p}.gate_up_proj_blocks"));
            if !mxfp4 && !inner.contains(&format!("{p}.gate_up_proj")) {
                continue;
            }
            let stored = [
                (
                    "gate_up_proj",
                    "gate_proj.weight",
                    StackedPart::GateUpMxfp4(0),
                ),
                (
                    "gate_up_proj",
                    "up_proj.weight",
                    StackedPart::GateUpMxfp4(1),
                ),
                ("down_proj", "down_proj.weight", StackedPart::DownMxfp4),
            ];
            for (from, to, part) in stored.into_iter().filter(|_| mxfp4) {
                let from = format!("{p}.{from}");
                for e in 0..num_experts {
                    experts.insert(format!("{p}.{e}.{to}"), (from.clone(), e, part));
                }
            }
            let stacked = [
                ("gate_up_proj", "gate_proj.weight", StackedPart::GateUp(0)),
                ("gate_up_proj", "up_proj.weight", StackedPart::GateUp(1)),
                (
                    "gate_up_proj_bias",
                    "gate_proj.bias",
                    StackedPart::GateUpBias(0),
                ),
                (
                    "gate_up_proj_bias",
                    "up_proj.bias",
                    StackedPart::GateUpBias(1),
                ),
                ("down_proj", "down_proj.weight", StackedPart::Down),
                ("down_proj_bias", "down_proj.bias", StackedPart::DownBias),
            ];
            for (from, to, part) in stacked {
                let from = format!("{p}.{from}");
                if !inner.contains(&from) {
                    continue;
                }
                for e in 0..num_experts {
                    experts.insert(format!("{p}.{e}.{to}"), (from.clone(), e, part));
                }
            }
        }
        Self {
            inner,
            parts,
            experts,
            num_experts,
        }
    }

    /// The stacked shape's checks: as many experts as the config says.
    fn stacked_shape(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        let (stacked, e, part) = &self.experts[name];
        let stacked = match part {
            StackedPart::GateUpMxfp4(_) | StackedPart::DownMxfp4 => format!("{stacked}_blocks"),
            _ => stacked.clone(),
        };
        let stacked = &stacked;
        let shape = self.inner.tensor_shape(stacked)?;
        match part.shape(&shape) {
            Some(s) if shape.first() == Some(&self.num_experts) => Ok(s),
            _ => Err(LoadError::Config(format!(
                "{stacked} has shape {shape:?}: not the config's {} experts (expert {e}) in \
                 the layout gpt-oss (or Gemma 4) stacks",
                self.num_experts
            ))),
        }
    }

    /// The fused tensor, the rows of `name` and of all the parts, when `name` is a part.
    fn part(&self, name: &str) -> Option<&(String, Vec<Range<usize>>, usize)> {
        self.parts.get(name)
    }
}

/// A fused tensor's name and each of its parts' names and runs of rows.
type Fusion = (&'static str, Vec<(&'static str, Vec<Range<usize>>)>);

/// Qwen3-Next's fused DeltaNet projections and their parts' runs of rows: group `g` of
/// `in_proj_qkvz` is `[q_g, k_g, v_g, z_g]` (`v_g` and `z_g` its value heads'), of
/// `in_proj_ba` `[b_g, a_g]`.
fn delta_net_groups(lin: &crate::config::LinearAttentionConfig) -> [Fusion; 2] {
    let (nk, dk, dv) = (lin.num_key_heads, lin.key_head_dim, lin.value_head_dim);
    let rpk = lin.num_value_heads / nk.max(1);
    let runs = |unit: usize, from: usize, len: usize| -> Vec<Range<usize>> {
        (0..nk)
            .map(|g| g * unit + from..g * unit + from + len)
            .collect()
    };
    let unit = 2 * dk + 2 * rpk * dv;
    let qkv = [
        runs(unit, 0, dk),
        runs(unit, dk, dk),
        runs(unit, 2 * dk, rpk * dv),
    ]
    .concat();
    [
        (
            "in_proj_qkvz",
            vec![
                ("in_proj_qkv", qkv),
                ("in_proj_z", runs(unit, 2 * dk + rpk * dv, rpk * dv)),
            ],
        ),
        (
            "in_proj_ba",
            vec![
                ("in_proj_b", runs(2 * rpk, 0, rpk)),
                ("in_proj_a", runs(2 * rpk, rpk, rpk)),
            ],
        ),
    ]
}

/// The rows `runs` of `data`, rows of `row_len` values, one after another.
fn gather<T: Copy>(data: &[T], runs: &[Range<usize>], row_len: usize) -> Vec<T> {
    runs.iter()
        .flat_map(|r| &data[r.start * row_len..r.end * row_len])
        .copied()
        .collect()
}

/// How many rows `runs` cover.
fn num_rows(runs: &[Range<usize>]) -> usize {
    runs.iter().map(Range::len).sum()
}

impl UnfusedSource<'_> {
    /// An expert's projection from gpt-oss's MXFP4 checkpoint as ggml MXFP4 blocks; `None`
    /// for any other tensor.
    fn mxfp4_expert(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
        let Some((base, e, part)) = self.experts.get(name) else {
            return Ok(None);
        };
        let parity = match part {
            StackedPart::GateUpMxfp4(p) => Some(*p),
            StackedPart::DownMxfp4 => None,
            _ => return Ok(None),
        };
        let shape = self.stacked_shape(name)?;
        let (bshape, blocks) = self.inner.load_bytes_index(&format!("{base}_blocks"), *e)?;
        let (sshape, scales) = self.inner.load_bytes_index(&format!("{base}_scales"), *e)?;
        let [rows, nb, 16] = bshape[..] else {
            unreachable!("checked by stacked_shape")
        };
        if sshape != [rows, nb] {
            return Err(LoadError::Config(format!(
                "{base}_scales has an expert of shape {sshape:?}, its blocks {bshape:?}"
            )));
        }
        let mut data = Vec::with_capacity(shape[0] * nb * 17);
        for r in (0..rows).filter(|r| parity.is_none_or(|p| r % 2 == p)) {
            for b in r * nb..(r + 1) * nb {
                // Hugging Face packs values 2k and 2k + 1 into byte k (low nibble first);
                // ggml packs values i and i + 16.
                let hf = &blocks[b * 16..(b + 1) * 16];
                let v = |i: usize| (hf[i / 2] >> (4 * (i % 2))) & 0x0F;
                data.push(scales[b]);
                data.extend((0..16).map(|i| v(i) | (v(i + 16) << 4)));
            }
        }
        Ok(Some(QuantTensor {
            shape,
            ty: minivllm_kernels::quant::GgmlType::MXFP4,
            data,
        }))
    }
}

/// The fused tensor's columns, when its rows are exactly its parts' (a config whose head
/// count or width is off would otherwise cut the parts at the wrong rows, and the model
/// would load and compute garbage).
fn rows_of(
    name: &str,
    fused: &str,
    shape: &[usize],
    rows: &[Range<usize>],
    parts_end: usize,
) -> Result<usize, LoadError> {
    match *shape {
        [total, cols] if total == parts_end && rows.iter().all(|r| r.end <= total) => Ok(cols),
        _ => Err(LoadError::Config(format!(
            "{fused} has shape {shape:?}, but the config's sizes give its parts {parts_end} \
             rows ({name}: rows {rows:?})"
        ))),
    }
}

impl WeightSource for UnfusedSource<'_> {
    fn load(&self, name: &str) -> Result<Tensor, LoadError> {
        if let Some(q) = self.mxfp4_expert(name)? {
            let mut data = vec![0.0; q.shape.iter().product()];
            minivllm_kernels::quant::dequantize(q.ty, &q.data, &mut data)
                .map_err(|e| LoadError::Config(format!("{name}: {e}")))?;
            return Ok(Tensor {
                shape: q.shape,
                data,
            });
        }
        if let Some((stacked, e, part)) = self.experts.get(name) {
            self.stacked_shape(name)?;
            return part.cut(name, self.inner.load_index(stacked, *e)?);
        }
        let Some((fused, rows, total)) = self.part(name) else {
            return self.inner.load(name);
        };
        let t = self.inner.load(fused)?;
        let cols = rows_of(name, fused, &t.shape, rows, *total)?;
        Ok(Tensor {
            shape: vec![num_rows(rows), cols],
            data: gather(&t.data, rows, cols),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.part(name).is_some() || self.experts.contains_key(name) || self.inner.contains(name)
    }

    fn tensor_shape(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        if self.experts.contains_key(name) {
            return self.stacked_shape(name);
        }
        let Some((fused, rows, total)) = self.part(name) else {
            return self.inner.tensor_shape(name);
        };
        let shape = self.inner.tensor_shape(fused)?;
        let cols = rows_of(name, fused, &shape, rows, *total)?;
        Ok(vec![num_rows(rows), cols])
    }

    fn load_quantized(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
        if self.experts.contains_key(name) {
            return self.mxfp4_expert(name);
        }
        let Some((fused, rows, total)) = self.part(name) else {
            return self.inner.load_quantized(name);
        };
        let Some(t) = self.inner.load_quantized(fused)? else {
            return Ok(None);
        };
        let cols = rows_of(name, fused, &t.shape, rows, *total)?;
        let row_bytes = cols / t.ty.block_size() * t.ty.type_size();
        Ok(Some(QuantTensor {
            shape: vec![num_rows(rows), cols],
            ty: t.ty,
            data: gather(&t.data, rows, row_bytes),
        }))
    }

    fn stored_half(&self, name: &str) -> Option<HalfKind> {
        if let Some((stacked, _, part)) = self.experts.get(name) {
            return match part {
                StackedPart::GateUpMxfp4(_) | StackedPart::DownMxfp4 => None,
                _ => self.inner.stored_half(stacked),
            };
        }
        match self.part(name) {
            Some((fused, ..)) => self.inner.stored_half(fused),
            None => self.inner.stored_half(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// One fused tensor per layer of `rows` rows of 4 columns, each value its row index.
    struct Fused {
        rows: usize,
    }

    impl WeightSource for Fused {
        fn load(&self, name: &str) -> Result<Tensor, LoadError> {
            assert!(name.ends_with("qkv_proj.weight"), "{name}");
            let data = (0..self.rows * 4).map(|i| (i / 4) as f32).collect();
            Ok(Tensor {
                shape: vec![self.rows, 4],
                data,
            })
        }
        fn contains(&self, name: &str) -> bool {
            name.ends_with("qkv_proj.weight")
        }
    }

    fn config() -> ModelConfig {
        ModelConfig::from_hf_json(&json!({
            "architectures": ["Phi3ForCausalLM"], "hidden_size": 4, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "vocab_size": 10,
        }))
        .unwrap()
    }

    /// q, k and v are the fused tensor's rows in that order; a fused tensor whose rows are
    /// not exactly the config's q + k + v is refused, naming both.
    #[test]
    fn parts_are_runs_of_rows_and_must_fill_the_fused_tensor() {
        let c = config();
        let (q, kv) = (c.q_size(), c.kv_size());
        let fused = Fused { rows: q + 2 * kv };
        let src = UnfusedSource::new(&fused, &c);
        let v = src.load("model.layers.0.self_attn.v_proj.weight").unwrap();
        assert_eq!(v.shape, [kv, 4]);
        assert_eq!(v.data[0], (q + kv) as f32);
        assert_eq!(
            src.tensor_shape("model.layers.0.self_attn.k_proj.weight")
                .unwrap(),
            [kv, 4]
        );
        // A config claiming fewer KV heads than the checkpoint has.
        let wrong = Fused { rows: q + 4 * kv };
        let src = UnfusedSource::new(&wrong, &c);
        let e = src
            .tensor_shape("model.layers.0.self_attn.q_proj.weight")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("qkv_proj") && e.contains(&format!("{} rows", q + 2 * kv)),
            "{e}"
        );
    }

    /// gpt-oss's stacked experts: `[experts, hidden, 2 * width]`, value `100 e + 10 h + c`.
    struct Stacked {
        experts: usize,
        two_width: usize,
    }

    impl WeightSource for Stacked {
        fn load(&self, name: &str) -> Result<Tensor, LoadError> {
            assert!(name.ends_with("experts.gate_up_proj"), "{name}");
            let (e, w) = (self.experts, self.two_width);
            let data = (0..e * 4 * w)
                .map(|i| (100 * (i / (4 * w)) + 10 * (i / w % 4) + i % w) as f32)
                .collect();
            Ok(Tensor {
                shape: vec![e, 4, w],
                data,
            })
        }
        fn contains(&self, name: &str) -> bool {
            name == "model.layers.0.mlp.experts.gate_up_proj"
        }
    }

    fn gpt_oss() -> ModelConfig {
        ModelConfig::from_hf_json(&json!({
            "architectures": ["GptOssForCausalLM"], "hidden_size": 4, "intermediate_size": 2,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "vocab_size": 10, "num_local_experts": 2, "num_experts_per_tok": 1,
            "head_dim": 2,
        }))
        .unwrap()
    }

    /// Expert 1's gate rows are its even columns, transposed; up's the odd ones. A stacked
    /// tensor of other than the config's experts, or of an odd width, is refused.
    #[test]
    fn stacked_experts_are_cut_per_expert_and_checked() {
        let c = gpt_oss();
        let src = Stacked {
            experts: 2,
            two_width: 4,
        };
        let src = UnfusedSource::new(&src, &c);
        let gate = src
            .load("model.layers.0.mlp.experts.1.gate_proj.weight")
            .unwrap();
        assert_eq!(gate.shape, [2, 4]);
        // Row j, column h: expert 1's value at (h, 2j).
        assert_eq!(
            gate.data,
            [100.0, 110.0, 120.0, 130.0, 102.0, 112.0, 122.0, 132.0]
        );
        let up = src
            .load("model.layers.0.mlp.experts.1.up_proj.weight")
            .unwrap();
        assert_eq!(up.data[..4], [101.0, 111.0, 121.0, 131.0]);
        for (experts, two_width) in [(3, 4), (2, 5)] {
            let bad = Stacked { experts, two_width };
            let src = UnfusedSource::new(&bad, &c);
            let err = src
                .tensor_shape("model.layers.0.mlp.experts.0.gate_proj.weight")
                .unwrap_err()
                .to_string();
            assert!(err.contains("gate_up_proj has shape"), "{err}");
        }
    }
}
