//! A Mixture-of-Experts MLP, vLLM's `FusedMoE` idea on a CPU: a router scores every expert
//! per token, each token goes to its top `k`, and the step's tokens are grouped by expert so
//! that each chosen expert's weights are read once for all the tokens routed to it (one
//! matrix product per expert over its rows, threaded over the expert's weight rows as any
//! projection is), while a one-token decode reads only its `k` experts. The outputs are
//! summed per token, weighted by the router's probabilities.
//!
//! Each token's sum runs over its experts in ascending order and every expert's product
//! computes each row on its own, so a token's output does not depend on what else is in
//! the batch. With tensor parallelism each expert is split by its width (gate/up rows) and
//! by the hidden rows of down, the router is whole on every rank, and the ranks gather the
//! activations and outputs of all the step's experts at once: two gathers per layer, as a
//! dense MLP needs, and one process's result to the bit.

use minivllm_kernels::qmatmul::matmul_quant_grouped;
use rayon::prelude::*;

use crate::config::{Activation, MoeConfig, RouterScoring};
use crate::distributed::{CommError, Communicator, GatherBuffers};
use crate::model_executor::layers::linear::{Linear, WeightMatrix};
use crate::model_executor::layers::mlp::{activate, add_bias, GatedMlp, MlpBuffers};
use crate::model_executor::layers::norm::RmsNorm;
use crate::model_executor::layers::parallel::{sized, whole_rows};
use crate::model_executor::loader::weights::{optional_vector, LoadOptions, WeightSource};
use crate::model_executor::loader::LoadError;

/// Qwen2-MoE's shared expert: a gated MLP every token runs, scaled by `sigmoid(gate · x)`.
pub(crate) struct SharedExpert {
    pub mlp: GatedMlp,
    /// `[hidden]`.
    pub gate: Vec<f32>,
}

/// Gemma 4's router: it reads the layer's residual stream, normed with no weight, scaled
/// per channel by `scale` and by `1/√hidden`; each chosen expert's weight is then scaled by
/// its `per_expert_scale`.
pub(crate) struct Gemma4Router {
    norm: RmsNorm,
    scale: Vec<f32>,
    per_expert_scale: Vec<f32>,
}

pub(crate) struct FusedMoe {
    /// `[num_experts, hidden]`, whole on every rank and kept in f32 (as vLLM and llama.cpp
    /// keep it): routing must not change with the experts' format or the rank.
    router: Linear,
    /// gpt-oss's router bias, `[num_experts]`.
    router_bias: Option<Vec<f32>>,
    experts: Vec<GatedMlp>,
    top_k: usize,
    scoring: RouterScoring,
    norm_topk_prob: bool,
    shared: Option<SharedExpert>,
    gemma4: Option<Gemma4Router>,
    /// Whether every expert's projections are single quantised matrices, which the
    /// grouped kernel runs all at once.
    grouped: bool,
}

/// The step's routing and the experts' activations, kept between forward passes so that
/// decoding allocates nothing.
#[derive(Default)]
pub(crate) struct MoeBuffers {
    /// Gemma 4's router input.
    router_in: Vec<f32>,
    router_logits: Vec<f32>,
    /// Per token, its `k` experts and their weights.
    topk_ids: Vec<u32>,
    topk_weights: Vec<f32>,
    /// Where each expert's rows start among the step's `t * k` routed rows (experts in
    /// order, tokens ascending within each), and each routed row's token and weight.
    offsets: Vec<usize>,
    /// The next free row of each expert while rows are placed.
    cursor: Vec<usize>,
    row_token: Vec<u32>,
    row_weight: Vec<f32>,
    /// Routed rows: inputs, gate/up outputs, activations (whole with tensor parallelism),
    /// outputs (this rank's columns, then whole).
    x: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    act_whole: Vec<f32>,
    y: Vec<f32>,
    y_whole: Vec<f32>,
    /// The shared expert's output and its MLP's scratch.
    shared_out: Vec<f32>,
    shared: MlpBuffers,
}

impl MoeBuffers {
    pub fn capacity(&self) -> usize {
        let f32s = [
            &self.router_in,
            &self.router_logits,
            &self.topk_weights,
            &self.row_weight,
            &self.x,
            &self.gate_up,
            &self.act,
            &self.act_whole,
            &self.y,
            &self.y_whole,
            &self.shared_out,
        ];
        f32s.iter().map(|v| v.capacity()).sum::<usize>()
            + self.topk_ids.capacity()
            + self.row_token.capacity()
            + self.offsets.capacity()
            + self.cursor.capacity()
            + self.shared.capacity()
    }
}

impl FusedMoe {
    /// Layer `layer`'s experts under the Hugging Face names (`mlp.gate.weight`,
    /// `mlp.experts.E.{gate,up,down}_proj.weight`, Qwen2-MoE's `mlp.shared_expert.*` and
    /// `mlp.shared_expert_gate.weight`; Mixtral's `block_sparse_moe` names are read too).
    /// `moe` is this rank's part, `whole` the model's; `own_hidden` this rank's rows of
    /// each down projection. `gemma4_eps` asks for Gemma 4's router (`router.proj`,
    /// `.scale`, `.per_expert_scale`), which norms its input with that epsilon.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        src: &dyn WeightSource,
        layer: usize,
        moe: &MoeConfig,
        whole: &MoeConfig,
        hidden: usize,
        own_hidden: usize,
        gemma4_eps: Option<f32>,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        let names = ExpertNames::find(src, layer);
        let router = Linear::load(
            src,
            &names.router,
            hidden,
            moe.num_experts,
            &LoadOptions::FLOAT32,
        )?;
        let router_bias = optional_vector(
            src,
            &names.router.replace(".weight", ".bias"),
            moe.num_experts,
        )?;
        // Experts load side by side: each is read and laid out for the kernels on its own
        // (a 30B-A3B file holds 6,144 of them), and laying out quantised blocks, not
        // reading the file, is most of a load's time.
        let experts = (0..moe.num_experts)
            .into_par_iter()
            .map(|e| {
                let [g, u, d] = names.expert(e);
                GatedMlp::load(
                    src,
                    [&g, &u, &d],
                    hidden,
                    moe.moe_intermediate_size,
                    whole.moe_intermediate_size,
                    own_hidden,
                    opts,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let shared = match (
            moe.shared_expert_intermediate_size,
            whole.shared_expert_intermediate_size,
        ) {
            (Some(width), Some(whole_width)) => {
                let p = format!("model.layers.{layer}.mlp.shared_expert");
                let gate_name = format!("model.layers.{layer}.mlp.shared_expert_gate.weight");
                // `[1, hidden]` in transformers, `[hidden]` in llama.cpp's files.
                let gate = src.load(&gate_name)?;
                if gate.data.len() != hidden {
                    return Err(LoadError::ShapeMismatch {
                        tensor: gate_name,
                        found: gate.shape,
                        expected: vec![1, hidden],
                    });
                }
                Some(SharedExpert {
                    mlp: GatedMlp::load(
                        src,
                        [
                            &format!("{p}.gate_proj.weight"),
                            &format!("{p}.up_proj.weight"),
                            &format!("{p}.down_proj.weight"),
                        ],
                        hidden,
                        width,
                        whole_width,
                        own_hidden,
                        opts,
                    )?,
                    gate: gate.data,
                })
            }
            _ => None,
        };
        let gemma4 = match gemma4_eps {
            Some(eps) => {
                let p = format!("model.layers.{layer}.router");
                let vector =
                    |name: String, len: usize| src.load(&name)?.expect_shape(&name, &[len]);
                Some(Gemma4Router {
                    norm: RmsNorm::unit(hidden, eps),
                    scale: vector(format!("{p}.scale"), hidden)?,
                    per_expert_scale: vector(format!("{p}.per_expert_scale"), moe.num_experts)?,
                })
            }
            None => None,
        };
        let mut moe_layer = Self::new(router, router_bias, experts, moe, shared);
        moe_layer.gemma4 = gemma4;
        Ok(moe_layer)
    }

    fn new(
        router: Linear,
        router_bias: Option<Vec<f32>>,
        experts: Vec<GatedMlp>,
        moe: &MoeConfig,
        shared: Option<SharedExpert>,
    ) -> Self {
        let grouped = experts
            .iter()
            .all(|e| e.matrices().iter().all(|m| m.as_quant().is_some()));
        Self {
            router,
            router_bias,
            experts,
            top_k: moe.num_experts_per_tok,
            scoring: moe.scoring,
            norm_topk_prob: moe.norm_topk_prob,
            shared,
            gemma4: None,
            grouped,
        }
    }

    /// Every weight matrix: the router's, every expert's, the shared expert's.
    pub fn matrices(&self) -> impl Iterator<Item = &WeightMatrix> {
        std::iter::once(self.router.weight())
            .chain(self.experts.iter().flat_map(GatedMlp::matrices))
            .chain(self.shared.iter().flat_map(|s| s.mlp.matrices()))
    }

    /// Bytes a step of `batch` tokens reads: the router's, the experts' that any of them
    /// picks (all experts are the same size) and the shared expert's. One token reads its
    /// `k` experts; a batch reads the union of its tokens' picks, `E·(1 − (1 − k/E)^batch)`
    /// experts expected where tokens pick evenly and independently, as random routers do
    /// (64 tokens over Qwen3-30B-A3B's 128 experts: 126 of them).
    pub(crate) fn bytes_per_step(&self, batch: usize) -> f64 {
        let shared = self.shared.as_ref().map_or(0, |s| s.mlp.nbytes());
        let e = self.experts.len() as f64;
        let picked = match batch {
            1 => self.top_k as f64,
            _ => e * (1.0 - (1.0 - self.top_k as f64 / e).powi(batch as i32)),
        };
        (self.router.weight().nbytes() + shared) as f64 + picked * self.experts[0].nbytes() as f64
    }

    /// Multiply-adds times two of one token through the router and its experts.
    pub(crate) fn flops_per_token(&self) -> f64 {
        let shared = self.shared.as_ref().map_or(0.0, |s| s.mlp.flops_per_row());
        self.router.weight().flops_per_row()
            + self.top_k as f64 * self.experts[0].flops_per_row()
            + shared
    }

    /// `out[t, hidden]` = the weighted sum of each token's `k` experts (plus the shared
    /// expert), from the normed `x[t, hidden]`. Gemma 4's router reads `router_x` (the
    /// residual stream) instead.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        x: &[f32],
        router_x: &[f32],
        t: usize,
        hidden: usize,
        act_fn: Activation,
        comm: &dyn Communicator,
        buf: &mut MoeBuffers,
        gather: &mut GatherBuffers,
        out: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        let num_experts = self.experts.len();
        let logits = sized(&mut buf.router_logits, t * num_experts);
        match &self.gemma4 {
            Some(g) => {
                let input = sized(&mut buf.router_in, t * hidden);
                g.norm.forward(&router_x[..t * hidden], input);
                let root = (hidden as f64).powf(-0.5) as f32;
                for row in input.chunks_exact_mut(hidden) {
                    row.iter_mut()
                        .zip(&g.scale)
                        .for_each(|(v, s)| *v = *v * s * root);
                }
                self.router.forward(input, logits, t);
            }
            None => self.router.forward(x, logits, t),
        }
        add_bias(logits, self.router_bias.as_deref());
        self.route(t, buf);
        let rows = t * self.top_k;

        let xs = sized(&mut buf.x, rows * hidden);
        for (dst, &tok) in xs.chunks_exact_mut(hidden).zip(&buf.row_token) {
            let tok = tok as usize;
            dst.copy_from_slice(&x[tok * hidden..(tok + 1) * hidden]);
        }
        let width = self.experts[0].width;
        let whole_width = self.experts[0].whole_width;
        let gate_up = sized(&mut buf.gate_up, rows * 2 * width);
        self.project(|e| &e.gate_up_proj, xs, gate_up, &buf.offsets);
        self.add_biases(|e| e.gate_up_bias.as_deref(), gate_up, &buf.offsets);
        let act = sized(&mut buf.act, rows * width);
        activate(act_fn, gate_up, act, width);
        let split = comm.world_size() > 1;
        let act = whole_rows(
            comm,
            split,
            act,
            rows,
            whole_width,
            gather,
            &mut buf.act_whole,
        )?;
        let own_hidden = self.experts[0].down_proj.out_features();
        let y = sized(&mut buf.y, rows * own_hidden);
        self.project(|e| &e.down_proj, act, y, &buf.offsets);
        let y = whole_rows(comm, split, y, rows, hidden, gather, &mut buf.y_whole)?;
        let y_len = y.len();
        // The down biases go on whole rows: they are not split over the ranks.
        let y = if split {
            &mut buf.y_whole[..y_len]
        } else {
            &mut buf.y[..y_len]
        };
        self.add_biases(|e| e.down_bias.as_deref(), y, &buf.offsets);

        // Rows are in expert order, so each token's sum runs over its experts in order.
        let out = sized(out, t * hidden);
        out.fill(0.0);
        for ((row, &tok), &w) in y
            .chunks_exact(hidden)
            .zip(&buf.row_token)
            .zip(&buf.row_weight)
        {
            let tok = tok as usize;
            let dst = &mut out[tok * hidden..(tok + 1) * hidden];
            dst.iter_mut().zip(row).for_each(|(o, &v)| *o += w * v);
        }

        if let Some(shared) = &self.shared {
            let mut shared_out = std::mem::take(&mut buf.shared_out);
            shared.mlp.forward(
                x,
                t,
                hidden,
                act_fn,
                comm,
                &mut buf.shared,
                gather,
                &mut shared_out,
            )?;
            for ((o, s), xr) in out
                .chunks_exact_mut(hidden)
                .zip(shared_out.chunks_exact(hidden))
                .zip(x.chunks_exact(hidden))
            {
                let g: f32 = xr.iter().zip(&shared.gate).map(|(a, b)| a * b).sum();
                let g = minivllm_kernels::activation::sigmoid(g);
                o.iter_mut().zip(s).for_each(|(o, &s)| *o += g * s);
            }
            buf.shared_out = shared_out;
        }
        Ok(())
    }

    /// `out = x · Wᵀ` for each expert's rows (`offsets`) and its projection `pick`: the
    /// quantised experts in one parallel loop, others one product per expert.
    fn project(
        &self,
        pick: impl Fn(&GatedMlp) -> &Linear + Sync,
        x: &[f32],
        out: &mut [f32],
        offsets: &[usize],
    ) {
        let first = pick(&self.experts[0]);
        let (cols, out_cols) = (first.in_features(), first.out_features());
        if self.grouped {
            let weight = |e: usize| {
                pick(&self.experts[e])
                    .weight()
                    .as_quant()
                    .expect("grouped experts are quantised")
            };
            return matmul_quant_grouped(x, out, offsets, cols, out_cols, &weight);
        }
        for (e, expert) in self.experts.iter().enumerate() {
            let (r0, r1) = (offsets[e], offsets[e + 1]);
            if r0 < r1 {
                pick(expert).forward(
                    &x[r0 * cols..r1 * cols],
                    &mut out[r0 * out_cols..r1 * out_cols],
                    r1 - r0,
                );
            }
        }
    }

    /// Each expert's bias (`pick`), if they have them, added to its rows of `out`.
    fn add_biases(
        &self,
        pick: impl Fn(&GatedMlp) -> Option<&[f32]>,
        out: &mut [f32],
        offsets: &[usize],
    ) {
        for (e, expert) in self.experts.iter().enumerate() {
            if let Some(bias) = pick(expert) {
                let n = bias.len();
                add_bias(&mut out[offsets[e] * n..offsets[e + 1] * n], Some(bias));
            }
        }
    }

    /// Each token's top `k` experts (ties to the lower index) and their weights, as the
    /// router's scoring has them, then the routed rows grouped by expert.
    fn route(&self, t: usize, buf: &mut MoeBuffers) {
        let (e_count, k) = (self.experts.len(), self.top_k);
        buf.topk_ids.resize(t * k, 0);
        buf.topk_weights.resize(t * k, 0.0);
        for ((logits, ids), weights) in buf
            .router_logits
            .chunks_exact_mut(e_count)
            .zip(buf.topk_ids.chunks_exact_mut(k))
            .zip(buf.topk_weights.chunks_exact_mut(k))
        {
            match self.scoring {
                RouterScoring::SoftmaxThenTopK => {
                    softmax_in_place(logits);
                    top_k(logits, ids, weights);
                    if self.norm_topk_prob {
                        let sum: f32 = weights.iter().sum();
                        weights.iter_mut().for_each(|w| *w /= sum);
                    }
                    if let Some(g) = &self.gemma4 {
                        for (w, &e) in weights.iter_mut().zip(ids.iter()) {
                            *w *= g.per_expert_scale[e as usize];
                        }
                    }
                }
                RouterScoring::TopKThenSoftmax => {
                    top_k(logits, ids, weights);
                    softmax_in_place(weights);
                }
            }
        }
        // A counting sort of the routed rows by expert.
        buf.offsets.clear();
        buf.offsets.resize(e_count + 1, 0);
        for &e in &buf.topk_ids {
            buf.offsets[e as usize + 1] += 1;
        }
        for e in 0..e_count {
            buf.offsets[e + 1] += buf.offsets[e];
        }
        buf.row_token.resize(t * k, 0);
        buf.row_weight.resize(t * k, 0.0);
        buf.cursor.clear();
        buf.cursor.extend_from_slice(&buf.offsets[..e_count]);
        for (tok, (ids, weights)) in buf
            .topk_ids
            .chunks_exact(k)
            .zip(buf.topk_weights.chunks_exact(k))
            .enumerate()
        {
            for (&e, &w) in ids.iter().zip(weights) {
                let at = &mut buf.cursor[e as usize];
                buf.row_token[*at] = tok as u32;
                buf.row_weight[*at] = w;
                *at += 1;
            }
        }
    }
}

/// `x = softmax(x)` in place, as PyTorch computes it in f32: `exp(x - max) / sum`.
fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

/// The `ids.len()` largest of `probs`, largest first (the lower index first among equals),
/// into `ids` and `weights`.
fn top_k(probs: &[f32], ids: &mut [u32], weights: &mut [f32]) {
    let k = ids.len();
    let mut n = 0;
    for (i, &p) in probs.iter().enumerate() {
        // Insertion into the sorted top list; k is small (2-10).
        let mut at = n;
        while at > 0 && weights[at - 1] < p {
            at -= 1;
        }
        if at >= k {
            continue;
        }
        let end = (n + 1).min(k);
        for j in (at + 1..end).rev() {
            ids[j] = ids[j - 1];
            weights[j] = weights[j - 1];
        }
        ids[at] = i as u32;
        weights[at] = p;
        n = end;
    }
}

/// The names a checkpoint gives a layer's router and experts: transformers' and Qwen's
/// (`mlp.gate`, `mlp.experts.E.gate_proj`), which llama.cpp's files map to, or Mixtral's
/// hub names (`block_sparse_moe.gate`, `block_sparse_moe.experts.E.w1` (gate), `w3` (up),
/// `w2` (down)).
pub(crate) struct ExpertNames {
    pub router: String,
    prefix: String,
    mixtral: bool,
}

impl ExpertNames {
    pub fn find(src: &dyn WeightSource, layer: usize) -> Self {
        let gemma4 = format!("model.layers.{layer}.router.proj.weight");
        if src.contains(&gemma4) {
            return Self {
                router: gemma4,
                prefix: format!("model.layers.{layer}.experts"),
                mixtral: false,
            };
        }
        let gpt_oss = format!("model.layers.{layer}.mlp.router.weight");
        if src.contains(&gpt_oss) {
            return Self {
                router: gpt_oss,
                prefix: format!("model.layers.{layer}.mlp.experts"),
                mixtral: false,
            };
        }
        let mixtral = format!("model.layers.{layer}.block_sparse_moe");
        if src.contains(&format!("{mixtral}.gate.weight")) {
            return Self {
                router: format!("{mixtral}.gate.weight"),
                prefix: format!("{mixtral}.experts"),
                mixtral: true,
            };
        }
        Self {
            router: format!("model.layers.{layer}.mlp.gate.weight"),
            prefix: format!("model.layers.{layer}.mlp.experts"),
            mixtral: false,
        }
    }

    /// Expert `e`'s gate, up and down projections.
    pub fn expert(&self, e: usize) -> [String; 3] {
        let names = if self.mixtral {
            ["w1", "w3", "w2"]
        } else {
            ["gate_proj", "up_proj", "down_proj"]
        };
        names.map(|n| format!("{}.{e}.{n}.weight", self.prefix))
    }
}

#[cfg(test)]
mod tests;
