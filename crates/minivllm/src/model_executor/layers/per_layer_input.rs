//! Gemma 4's per-layer input embeddings (PLE; E2B, E4B): every layer gets a small input of
//! its own per token, the sum of a row of a second embedding table (a slice per layer) and
//! a projection of the token's embedding, and adds a gated projection of it to its output.
//! The table is most of E2B's parameters but is only looked up, one row per token.

use minivllm_kernels::activation::gelu_tanh;

use crate::config::PerLayerInput;
use crate::model_executor::layers::linear::{Linear, WeightMatrix};
use crate::model_executor::layers::norm::RmsNorm;
use crate::model_executor::layers::parallel::sized;
use crate::model_executor::loader::weights::{LoadOptions, WeightSource};
use crate::model_executor::loader::LoadError;

/// The model's part: `[tokens, layers, width]` inputs from the token ids and embeddings.
pub(crate) struct PerLayerEmbeddings {
    /// `[vocab, layers · width]`, kept in its stored format.
    table: WeightMatrix,
    /// `[layers · width, hidden]`.
    projection: Linear,
    /// Over each layer's `width` values of the projection.
    norm: RmsNorm,
    shape: PerLayerInput,
    layers: usize,
    hidden: usize,
}

impl PerLayerEmbeddings {
    /// `norm` builds an RMSNorm of the model's kind over `width` values from its name.
    pub fn load(
        src: &dyn WeightSource,
        shape: PerLayerInput,
        layers: usize,
        hidden: usize,
        norm: RmsNorm,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        let wide = layers * shape.hidden;
        Ok(Self {
            table: WeightMatrix::load_rows(
                src,
                &[("model.embed_tokens_per_layer.weight", shape.vocab)],
                wide,
                &opts.for_output(),
            )?,
            projection: Linear::load(
                src,
                "model.per_layer_model_projection.weight",
                hidden,
                wide,
                opts,
            )?,
            norm,
            shape,
            layers,
            hidden,
        })
    }

    /// `out[t, layers · width] = (norm(projection(embeds) / √hidden) + table[token] · √width)
    /// / √2`, as transformers computes it (each scale rounded to f32 first). `embeds` are
    /// the scaled token embeddings; `scratch` is kept between steps.
    pub fn forward(
        &self,
        tokens: &[u32],
        embeds: &[f32],
        scratch: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) {
        let (t, wide) = (tokens.len(), self.layers * self.shape.hidden);
        let projected = sized(scratch, t * wide);
        self.projection.forward(embeds, projected, t);
        let down = (self.hidden as f64).powf(-0.5) as f32;
        projected.iter_mut().for_each(|x| *x *= down);
        let out = sized(out, t * wide);
        self.norm.forward(projected, out);
        let (up, half) = (
            (self.shape.hidden as f64).sqrt() as f32,
            std::f64::consts::FRAC_1_SQRT_2 as f32,
        );
        for (row, &tok) in out.chunks_exact_mut(wide).zip(tokens) {
            let own = &mut projected[..wide];
            match tok as usize {
                r if r < self.shape.vocab => self.table.row_into(r, own),
                _ => own.fill(0.0),
            }
            for (o, e) in row.iter_mut().zip(own.iter()) {
                *o = (*o + e * up) * half;
            }
        }
    }

    pub fn matrices(&self) -> [&WeightMatrix; 2] {
        [&self.table, self.projection.weight()]
    }
}

/// A layer's part: `stream += norm(projection(gelu(gate(stream)) · input))`.
pub(crate) struct PerLayerInputBlock {
    gate: Linear,
    projection: Linear,
    norm: RmsNorm,
}

impl PerLayerInputBlock {
    /// Layer `i`'s (`prefix` `model.layers.i`); `norm` its output norm, loaded.
    pub fn load(
        src: &dyn WeightSource,
        prefix: &str,
        hidden: usize,
        width: usize,
        norm: RmsNorm,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        let name = |s: &str| format!("{prefix}.{s}.weight");
        Ok(Self {
            gate: Linear::load(src, &name("per_layer_input_gate"), hidden, width, opts)?,
            projection: Linear::load(src, &name("per_layer_projection"), width, hidden, opts)?,
            norm,
        })
    }

    pub fn matrices(&self) -> [&WeightMatrix; 2] {
        [self.gate.weight(), self.projection.weight()]
    }

    /// Adds the block's output to `stream` (`[t, hidden]`); `inputs` are the model's
    /// `[t, layers · width]` per-layer inputs, of which layer `layer`'s are used. `act`,
    /// `projected` and `normed` are scratch kept between steps.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        stream: &mut [f32],
        inputs: &[f32],
        layer: usize,
        t: usize,
        act: &mut Vec<f32>,
        projected: &mut Vec<f32>,
        normed: &mut Vec<f32>,
    ) {
        if t == 0 {
            return;
        }
        let (hidden, width) = (self.gate.in_features(), self.gate.out_features());
        let act = sized(act, t * width);
        self.gate.forward(stream, act, t);
        let wide = inputs.len() / t;
        for (row, input) in act.chunks_exact_mut(width).zip(inputs.chunks_exact(wide)) {
            let own = &input[layer * width..(layer + 1) * width];
            for (a, x) in row.iter_mut().zip(own) {
                *a = gelu_tanh(*a) * x;
            }
        }
        let projected = sized(projected, t * hidden);
        self.projection.forward(act, projected, t);
        let normed = sized(normed, t * hidden);
        self.norm.forward(projected, normed);
        stream
            .iter_mut()
            .zip(normed.iter())
            .for_each(|(s, n)| *s += n);
    }
}
