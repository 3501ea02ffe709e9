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
    /// q, k and v projections stacked: `[(heads + 2 kv_heads) * head_dim, hidden]` (with
    /// an output gate, each head's q rows followed by its gate rows).
    pub qkv_proj: Linear,
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
        let c = &self.local;
        let t = input.num_tokens();
        let (qs, kvs) = (c.q_size(), c.kv_size());
        // With an output gate each head's q rows are followed by its gate's.
        let q_rows = if layer.output_gate { 2 * qs } else { qs };
        let qkv = sized(&mut buf.qkv, t * (q_rows + 2 * kvs));
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
        let hd = c.head_dim;
        for (i, row) in qkv.chunks_exact(q_rows + 2 * kvs).enumerate() {
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
            match &layer.k_norm {
                Some(norm) => norm.forward(&kv_row[..kvs], k),
                None => k.copy_from_slice(&kv_row[..kvs]),
            }
            v[i * kvs..(i + 1) * kvs].copy_from_slice(&kv_row[kvs..]);
        }
        let (rotary, step) = match &self.local_rotary {
            Some(local) if layer.window.is_some() => (local, &buf.rope_local),
            _ => (&self.rotary, &buf.rope),
        };
        rotary.forward(step, q, c.num_attention_heads);
        rotary.forward(step, k, c.num_key_value_heads);
        let out = sized(&mut buf.attn_out, t * qs);
        attn.forward(q, k, v, kv, meta, out);
        if layer.output_gate {
            for (o, &g) in out.iter_mut().zip(&buf.gate[..t * qs]) {
                *o *= sigmoid(g);
            }
        }
        let comm = &*self.comm;
        let (q_size, h) = (self.config.q_size(), self.config.hidden_size);
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
