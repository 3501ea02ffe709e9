//! A decoder layer's attention: q, k and v from one product (Qwen2's biases, the q/k norms,
//! Qwen3.5's output gate split out of the q rows), RoPE, paged attention over the layer's
//! KV cache, and the output projection, its columns gathered across tensor-parallel ranks.

use minivllm_kernels::activation::sigmoid;

use crate::distributed::CommError;
use crate::model_executor::input_metadata::InputMetadata;
use crate::model_executor::layers::attention::{AttentionMetadata, LayerKvCache, PagedAttention};
use crate::model_executor::layers::linear::Linear;
use crate::model_executor::layers::mlp::add_bias;
use crate::model_executor::layers::norm::RmsNorm;
use crate::model_executor::layers::parallel::{project_whole, sized, whole_rows};

use super::{ForwardBuffers, LlamaForCausalLM};

pub(super) struct SelfAttention {
    /// This rank's heads and KV heads, and the layer's head size (Gemma 4's full layers
    /// have their own).
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// q, k and v projections stacked: `[(heads + 2 kv_heads) * head_dim, hidden]` (with
    /// an output gate, each head's q rows followed by its gate rows; without the v rows
    /// where k is v, and only q where the K/V are another layer's).
    pub qkv_proj: Linear,
    pub kv: LayerKv,
    /// Gemma 4's norm (with no weight) of each head's v.
    pub v_norm: Option<RmsNorm>,
    /// Qwen2's q, k and v biases, stacked as the projections are (this rank's part).
    pub qkv_bias: Option<Vec<f32>>,
    /// Qwen3's and Gemma's norms over each head's q and k (`[head_dim]`), or OLMoE's over
    /// the whole q and k (`[q_size]`, `[kv_size]`).
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub o_proj: Linear,
    /// gpt-oss's output bias (whole: added once the ranks' columns are gathered) and its
    /// sink logit per head (this rank's heads).
    pub o_bias: Option<Vec<f32>>,
    pub sinks: Option<Vec<f32>>,
    /// Qwen3.5's gate on each head's output (`sigmoid` of the q projection's gate rows).
    pub output_gate: bool,
    /// A sliding-window layer's window (`None`: the whole context). Such layers use the
    /// local RoPE table where the model has one (Gemma 3's own base).
    pub window: Option<usize>,
}

/// Where a layer's K/V come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum LayerKv {
    /// Its own projections; with `k_eq_v` the values are the raw keys (Gemma 4's full
    /// layers, which have no v projection).
    Own { k_eq_v: bool },
    /// An earlier layer's, already in the cache this step (Gemma 4's last layers).
    Shared,
}

impl SelfAttention {
    fn q_size(&self) -> usize {
        self.heads * self.head_dim
    }

    fn kv_size(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// The k and v rows of each token in the stacked projection.
    fn kv_rows(&self) -> usize {
        match self.kv {
            LayerKv::Own { k_eq_v: false } => 2 * self.kv_size(),
            LayerKv::Own { k_eq_v: true } => self.kv_size(),
            LayerKv::Shared => 0,
        }
    }
}

impl LlamaForCausalLM {
    /// `hidden = o_proj(attention(rope(q), rope(k), v))`, from the normed `hidden`.
    pub(super) fn attention_block(
        &self,
        layer: &SelfAttention,
        input: &InputMetadata,
        meta: &AttentionMetadata<'_>,
        attn: &PagedAttention,
        kv: &mut LayerKvCache,
        buf: &mut ForwardBuffers,
    ) -> Result<(), CommError> {
        let t = input.num_tokens();
        let (qs, kvs) = (layer.q_size(), layer.kv_size());
        // With an output gate each head's q rows are followed by its gate's.
        let q_rows = if layer.output_gate { 2 * qs } else { qs };
        let row_len = q_rows + layer.kv_rows();
        let qkv = sized(&mut buf.qkv, t * row_len);
        layer.qkv_proj.forward(&buf.hidden, qkv, t);
        add_bias(qkv, layer.qkv_bias.as_deref());
        let q = sized(&mut buf.q, t * qs);
        let k = sized(&mut buf.k, t * kvs);
        let v = sized(&mut buf.v, t * kvs);
        let (gate, q_raw) = if layer.output_gate {
            (sized(&mut buf.gate, t * qs), sized(&mut buf.q_raw, qs))
        } else {
            (&mut [][..], &mut [][..])
        };
        let hd = layer.head_dim;
        for (i, row) in qkv.chunks_exact(row_len).enumerate() {
            let (q, k) = (&mut q[i * qs..(i + 1) * qs], &mut k[i * kvs..(i + 1) * kvs]);
            let q_in = if layer.output_gate {
                let gate = &mut gate[i * qs..(i + 1) * qs];
                for (h, pair) in row[..2 * qs].chunks_exact(2 * hd).enumerate() {
                    q_raw[h * hd..(h + 1) * hd].copy_from_slice(&pair[..hd]);
                    gate[h * hd..(h + 1) * hd].copy_from_slice(&pair[hd..]);
                }
                &*q_raw
            } else {
                &row[..qs]
            };
            let kv_row = &row[q_rows..];
            // The q/k norms go head by head (rows of head_dim) as the rows are split out.
            match &layer.q_norm {
                Some(norm) => norm.forward(q_in, q),
                None => q.copy_from_slice(q_in),
            }
            let LayerKv::Own { k_eq_v } = layer.kv else {
                continue;
            };
            match &layer.k_norm {
                Some(norm) => norm.forward(&kv_row[..kvs], k),
                None => k.copy_from_slice(&kv_row[..kvs]),
            }
            let (v_in, v) = (
                if k_eq_v {
                    &kv_row[..kvs]
                } else {
                    &kv_row[kvs..]
                },
                &mut v[i * kvs..(i + 1) * kvs],
            );
            match &layer.v_norm {
                Some(norm) => norm.forward(v_in, v),
                None => v.copy_from_slice(v_in),
            }
        }
        let (rotary, step) = match &self.local_rotary {
            Some(local) if layer.window.is_some() => (local, &buf.rope_local),
            _ => (&self.rotary, &buf.rope),
        };
        rotary.forward(step, q, layer.heads);
        let out = sized(&mut buf.attn_out, t * qs);
        if layer.kv == LayerKv::Shared {
            attn.attend(q, kv, meta, out);
        } else {
            rotary.forward(step, k, layer.kv_heads);
            attn.forward(q, k, v, kv, meta, out);
        }
        if layer.output_gate {
            for (o, &g) in out.iter_mut().zip(&buf.gate[..t * qs]) {
                *o *= sigmoid(g);
            }
        }
        let comm = &*self.comm;
        let (q_size, h) = (
            self.config.num_attention_heads * hd,
            self.config.hidden_size,
        );
        let heads = whole_rows(
            comm,
            self.heads_split,
            out,
            t,
            q_size,
            &mut buf.gather,
            &mut buf.whole,
        )?;
        project_whole(
            comm,
            &layer.o_proj,
            heads,
            t,
            h,
            &mut buf.local_out,
            &mut buf.gather,
            &mut buf.hidden,
        )?;
        add_bias(&mut buf.hidden[..t * h], layer.o_bias.as_deref());
        Ok(())
    }
}
