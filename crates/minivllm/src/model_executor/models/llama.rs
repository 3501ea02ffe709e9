//! LLaMA-family decoder: RMSNorm, GQA attention with RoPE over a paged KV cache, a gated
//! MLP, optionally tied embeddings. The families differ only in parts the config switches
//! on (vLLM keeps one file per family; here they share this one, which names what differs):
//! - Llama 2/3, Mistral, SmolLM2, TinyLlama: the plain decoder;
//! - Qwen2 / Qwen2.5: a bias on q, k and v;
//! - Qwen3: an RMSNorm over each head's q and k before RoPE;
//! - Gemma 2: norms after attention and after the MLP too, (1 + w) norm weights, GeGLU,
//!   embeddings scaled by √hidden, scores scaled by `query_pre_attn_scalar`, every other
//!   layer sliding, scores and final logits soft-capped (`cap · tanh(x / cap)`);
//! - Gemma 3: Gemma 2 with q/k norms and no soft-capping, and sliding-window layers with
//!   their own RoPE base;
//! - Phi-3 / Phi-4: q/k/v and gate/up stored fused (split at load, `loader/fused.rs`),
//!   LongRoPE and a partial rotary dimension (`layers/rotary.rs`);
//! - Mixture-of-Experts families (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE): routed experts in
//!   place of the MLP (`layers/fused_moe.rs`), Qwen2-MoE's shared expert, OLMoE's norms
//!   over the whole q and k projections;
//! - gpt-oss: experts with biases and a clamped SwiGLU picked by the top router logits,
//!   biases on q, k, v and o, a learned sink per head in each softmax, every other layer
//!   sliding;
//! - Qwen3.5: three Gated DeltaNet linear-attention layers to one full-attention layer
//!   (`layers/gated_delta_net.rs`: a recurrent state per sequence in place of K/V), and on
//!   the full-attention layers a sigmoid gate from the q projection on each head's output;
//!   (1 + w) norms; RoPE over a quarter of each head;
//! - Gemma 4: Gemma 3's layout with plain norms, unscaled scores and a norm on v, full
//!   layers of their own head size (keys as values where `attention_k_eq_v`) with
//!   "proportional" RoPE, the last layers attending to earlier layers' K/V, per-layer
//!   input embeddings (`layers/per_layer_input.rs`) and a stored scale per layer, both
//!   applied to the whole residual stream at the layer's end.

use std::ops::Range;
use std::sync::Arc;

use minivllm_kernels::attention::softcap;

use crate::config::{KvCacheLayout, ModelConfig, RopeScaling};
use crate::distributed::{gather_columns, share, Communicator, SingleProcess};
use crate::model_executor::input_metadata::{InputError, InputMetadata};
use crate::model_executor::layers::attention::{AttentionMetadata, LayerKvCache, PagedAttention};
use crate::model_executor::layers::gated_delta_net::{DeltaSeq, GatedDeltaNet, LayerStateCache};
use crate::model_executor::layers::linear::{Linear, WeightMatrix};
use crate::model_executor::layers::norm::RmsNorm;
use crate::model_executor::layers::parallel::sized;
use crate::model_executor::layers::per_layer_input::{PerLayerEmbeddings, PerLayerInputBlock};
use crate::model_executor::layers::rotary::RotaryEmbedding;
use crate::model_executor::loader::fused::UnfusedSource;
use crate::model_executor::loader::sharded::{Rank, ShardedSource};
use crate::model_executor::loader::weights::{LoadOptions, WeightSource};
use crate::model_executor::loader::LoadError;

mod attention;
mod buffers;
mod load;
mod mlp;

use attention::SelfAttention;
pub use buffers::ForwardBuffers;
use mlp::Mlp;

pub use load::check_config_against_weights;
use load::{llama_split, load_layer, load_norm};

struct DecoderLayer {
    input_layernorm: RmsNorm,
    mixer: Mixer,
    /// Gemma's norm of the attention output, before the residual add.
    post_attention_norm: Option<RmsNorm>,
    /// The MLP's input norm (LLaMA's `post_attention_layernorm`, Gemma's
    /// `pre_feedforward_layernorm`).
    pre_mlp_layernorm: RmsNorm,
    mlp: Mlp,
    /// Gemma's norm of the MLP output, before the residual add.
    post_mlp_norm: Option<RmsNorm>,
    /// Gemma 4: what the layer adds from its per-layer input, and the scale of its output.
    per_layer_input: Option<PerLayerInputBlock>,
    layer_scalar: Option<f32>,
}

/// What mixes a layer's tokens: attention over the KV cache, or linear attention over a
/// state per sequence.
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Mixer {
    Attention(SelfAttention),
    /// `state`: the layer's index among the linear-attention layers, which is its state
    /// store's in the cache.
    Linear {
        net: GatedDeltaNet,
        state: usize,
    },
}

impl Mixer {
    fn matrices(&self) -> Vec<&WeightMatrix> {
        match self {
            Mixer::Attention(a) => vec![a.qkv_proj.weight(), a.o_proj.weight()],
            Mixer::Linear { net, .. } => net.matrices().to_vec(),
        }
    }
}

pub struct LlamaForCausalLM {
    config: ModelConfig,
    /// This rank's part of `config` (all of it in one process): its heads, KV heads, MLP
    /// width and vocabulary rows.
    local: ModelConfig,
    comm: Arc<dyn Communicator>,
    /// The vocabulary rows of the embeddings (and LM head) this rank holds.
    vocab_rows: Range<usize>,
    /// Whether this rank computes only its part of the heads (else all of them).
    heads_split: bool,
    /// Rows are dequantised as tokens look them up; a tied LM head multiplies by it as stored.
    embed_tokens: WeightMatrix,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None` when tied to the embeddings.
    lm_head: Option<Linear>,
    rotary: RotaryEmbedding,
    /// The sliding-window layers' RoPE table, where their base is their own.
    local_rotary: Option<RotaryEmbedding>,
    /// Which KV cache group and slot each layer's K/V use.
    kv_layout: KvCacheLayout,
    /// Gemma 4's per-layer input embeddings.
    per_layer_embeddings: Option<PerLayerEmbeddings>,
}

impl LlamaForCausalLM {
    pub fn load(
        config: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        Self::load_parallel(config, src, opts, Arc::new(SingleProcess))
    }

    /// This rank's part of the model for tensor parallelism. Every matrix is split by its
    /// output rows: q/k/v by whole heads (when whole KV groups go to each rank; otherwise
    /// each rank computes every head), gate/up by the MLP's width, the output and down
    /// projections by the hidden width, the embeddings and LM head by vocabulary; any width
    /// splits, the first ranks holding one more row. The ranks gather each other's output
    /// columns instead of all-reducing partial sums, so every dot product is one process's
    /// and the group's logits are one process's to the bit (see `distributed::shards`).
    /// Each tensor is cut as it is read, in its stored format.
    pub fn load_parallel(
        config: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
        comm: Arc<dyn Communicator>,
    ) -> Result<Self, LoadError> {
        config.validate()?;
        let unfused = UnfusedSource::new(src, config);
        let src: &dyn WeightSource = &unfused;
        check_config_against_weights(config, src, "model config")?;
        let rank = Rank {
            rank: comm.rank(),
            world_size: comm.world_size(),
        };
        let local = config.tensor_parallel_part(rank.rank, rank.world_size);
        let heads_split = rank.world_size > 1 && config.attention_split(rank.world_size).is_some();
        if rank.world_size > 1 && !heads_split {
            tracing::info!(
                heads = config.num_attention_heads,
                kv_heads = config.num_key_value_heads,
                ranks = rank.world_size,
                "the attention heads stay whole on every rank (KV heads that do not split in \
                 whole groups, a norm over all of q, or Gemma 4's layers of two shapes); the \
                 MLP, projections and vocabulary are still split"
            );
        }
        // Ranks sharing each KV head, when there are fewer KV heads than ranks.
        let kv_copies = rank.world_size / config.num_key_value_heads.min(rank.world_size);
        let split = |name: &str| llama_split(name, heads_split.then_some(kv_copies));
        let sharded = ShardedSource::new(src, rank, &split);
        let src: &dyn WeightSource = if rank.world_size == 1 { src } else { &sharded };
        let vocab_rows = share(config.vocab_size, rank.rank, rank.world_size);
        let c = &local;
        let h = c.hidden_size;
        let out_opts = opts.for_output();
        let embed_tokens = WeightMatrix::load_rows(
            src,
            &[("model.embed_tokens.weight", c.vocab_size)],
            h,
            &out_opts,
        )?;
        // The vocabulary-wide matrices load first: a matrix is briefly held twice (as read,
        // and in the kernels' layout), and twice the LM head on top of every layer's weights
        // would set the process's peak (Qwen2.5-0.5B's: 2 × 138 MiB).
        // Some checkpoints that tie embeddings still ship lm_head; when the config says
        // tied we follow it, as transformers does.
        let lm_head = if c.tie_word_embeddings || !src.contains("lm_head.weight") {
            if !c.tie_word_embeddings {
                tracing::warn!("lm_head.weight absent: using the tied token embeddings");
            }
            None
        } else {
            Some(Linear::load(
                src,
                "lm_head.weight",
                h,
                c.vocab_size,
                &out_opts,
            )?)
        };
        let layers = (0..c.num_hidden_layers)
            .map(|i| load_layer(config, c, rank, src, i, opts))
            .collect::<Result<Vec<_>, _>>()?;
        // Gemma 4's full layers turn heads of their own size, all their dims.
        let rotary = match &c.gemma4 {
            Some(g) => RotaryEmbedding::with_dims(
                c,
                g.full_head_dim,
                g.full_head_dim,
                c.rope_theta,
                &c.rope_scaling,
            ),
            None => RotaryEmbedding::new(c),
        };
        let local_rotary = match c.rope_local_theta {
            Some(theta) if !c.sliding_layers.is_empty() => {
                Some(RotaryEmbedding::with_base(c, theta, &RopeScaling::None))
            }
            _ => None,
        };
        let per_layer_embeddings = match c.gemma4.as_ref().and_then(|g| g.per_layer_input) {
            Some(p) => Some(PerLayerEmbeddings::load(
                src,
                p,
                c.num_hidden_layers,
                h,
                load_norm(c, src, "model.per_layer_projection_norm.weight", p.hidden)?,
                opts,
            )?),
            None => None,
        };
        Ok(Self {
            per_layer_embeddings,
            config: config.clone(),
            local: local.clone(),
            comm,
            vocab_rows,
            heads_split,
            embed_tokens,
            layers,
            norm: load_norm(c, src, "model.norm.weight", h)?,
            lm_head,
            rotary,
            local_rotary,
            kv_layout: KvCacheLayout::for_model(config),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The tensor-parallel group this model's ranks share.
    pub fn communicator(&self) -> &Arc<dyn Communicator> {
        &self.comm
    }

    /// This rank's part of the model: what its KV cache and buffers are sized by.
    pub fn local_config(&self) -> &ModelConfig {
        &self.local
    }

    /// Bounds positions to `max_model_len` (which must not exceed the model's context); with
    /// LongRoPE, it picks the factors.
    pub fn set_max_model_len(&mut self, max_model_len: usize) {
        if let Some(local) = &mut self.local_rotary {
            local.set_max_positions(max_model_len);
        }
        self.rotary.set_max_positions(max_model_len);
    }

    fn layer_matrices(&self) -> impl Iterator<Item = &WeightMatrix> {
        self.layers.iter().flat_map(|l| {
            let ple = l.per_layer_input.iter().flat_map(|p| p.matrices());
            l.mixer
                .matrices()
                .into_iter()
                .chain(l.mlp.matrices())
                .chain(ple)
        })
    }

    /// The attention (and linear attention) projections' matrices of every layer.
    fn attention_matrices(&self) -> impl Iterator<Item = &WeightMatrix> {
        self.layers.iter().flat_map(|l| l.mixer.matrices())
    }

    /// The linear-attention layers, in order: one state store each in the cache.
    fn linear_layers(&self) -> impl Iterator<Item = &GatedDeltaNet> + Clone {
        self.layers.iter().filter_map(|l| match &l.mixer {
            Mixer::Linear { net, .. } => Some(net),
            Mixer::Attention(_) => None,
        })
    }

    /// Every weight matrix (the embeddings once, even when tied).
    fn matrices(&self) -> impl Iterator<Item = &WeightMatrix> {
        std::iter::once(&self.embed_tokens)
            .chain(self.per_layer_embeddings.iter().flat_map(|p| p.matrices()))
            .chain(self.layer_matrices())
            .chain(self.lm_head.as_ref().map(Linear::weight))
    }

    /// Bytes of weight matrices per storage format, largest first: `[("Q4_1", 70e6), ...]`.
    pub fn weight_formats(&self) -> Vec<(&'static str, usize)> {
        let mut by_format = std::collections::BTreeMap::new();
        for m in self.matrices().flat_map(WeightMatrix::leaves) {
            *by_format.entry(m.format()).or_insert(0) += m.nbytes();
        }
        let mut v: Vec<_> = by_format.into_iter().collect();
        v.sort_by_key(|&(_, bytes)| std::cmp::Reverse(bytes));
        v
    }

    /// Bytes a decode step of `batch` sequences reads from weight matrices: every layer's
    /// (of a Mixture-of-Experts layer, the router's and the experts' its tokens pick: `k`
    /// for one token), and the LM head's. (The embeddings are read a row per token; tied,
    /// they are the LM head.)
    pub fn weight_bytes_per_step(&self, batch: usize) -> f64 {
        let dense = self
            .attention_matrices()
            .map(WeightMatrix::nbytes)
            .sum::<usize>()
            + self.lm_head().nbytes();
        dense as f64
            + self
                .layers
                .iter()
                .map(|l| l.mlp.bytes_per_step(batch))
                .sum::<f64>()
    }

    /// Floating-point operations (two per multiply-add) of one token through the layers'
    /// weight matrices (a token's `k` experts), LM head excluded (it runs only for the rows
    /// that are sampled).
    pub fn layer_flops_per_token(&self) -> f64 {
        self.attention_matrices()
            .map(WeightMatrix::flops_per_row)
            .sum::<f64>()
            + self
                .layers
                .iter()
                .map(|l| l.mlp.flops_per_token())
                .sum::<f64>()
    }

    /// Floating-point operations of the LM head for one sampled row.
    pub fn head_flops(&self) -> f64 {
        2.0 * (self.config.vocab_size * self.config.hidden_size) as f64
    }

    /// Floating-point operations of one token's attention over `context` positions, all
    /// attention layers (each of its own head size): scores and the weighted sum of values.
    pub fn attention_flops(&self, context: usize) -> f64 {
        let c = &self.config;
        let widths = (0..c.num_hidden_layers)
            .filter(|&i| matches!(self.layers[i].mixer, Mixer::Attention(_)))
            .map(|i| {
                let (heads, _, head_dim) = c.layer_attention(i);
                heads * head_dim
            })
            .sum::<usize>();
        4.0 * (context * widths) as f64
    }

    /// Floating-point operations of one sequence whose `tokens` positions each go through the
    /// layers once (attending to every position before them) and `sampled` of which go
    /// through the LM head.
    pub fn sequence_flops(&self, tokens: usize, sampled: usize) -> f64 {
        tokens as f64 * self.layer_flops_per_token()
            + self.attention_flops(tokens * (tokens + 1) / 2)
            + sampled as f64 * self.head_flops()
    }

    /// Runs the flat batch described by `input`, writing its K/V into `kv_caches` (one per
    /// layout slot, blocks of `block_size` tokens) and carrying the linear-attention layers'
    /// states in `states` (one per such layer) on, and returns the logits of the positions
    /// in `input.logits_indices`: `[logits_indices.len(), vocab_size]`. In a
    /// tensor-parallel group they are gathered on rank 0, which samples; the other ranks
    /// get none.
    pub fn forward<'b>(
        &self,
        input: &InputMetadata,
        kv_caches: &mut [LayerKvCache],
        states: &mut [LayerStateCache],
        block_size: usize,
        buf: &'b mut ForwardBuffers,
    ) -> Result<&'b [f32], InputError> {
        self.forward_hidden(input, kv_caches, states, block_size, buf)?;
        self.compute_logits(input.logits_indices.len(), buf)
    }

    /// [`forward`](Self::forward) up to the LM head: the final-normed hidden states of the
    /// positions in `input.logits_indices`, `[logits_indices.len(), hidden_size]`, on every
    /// rank. For callers with a head of their own (a draft model's partial vocabulary).
    pub(crate) fn forward_hidden<'b>(
        &self,
        input: &InputMetadata,
        kv_caches: &mut [LayerKvCache],
        states: &mut [LayerStateCache],
        block_size: usize,
        buf: &'b mut ForwardBuffers,
    ) -> Result<&'b [f32], InputError> {
        let c = &self.local;
        // Every layer's blocks are the widest layer's size apart.
        let block_stride = block_size * c.kv_slot_size();
        let num_blocks = kv_caches
            .first()
            .map_or(0, |kv| kv.key.len() / block_stride.max(1));
        let layout = &self.kv_layout;
        input.validate(
            block_size,
            num_blocks,
            self.config.vocab_size,
            layout.windows(),
        )?;
        if kv_caches.len() != layout.num_slots() {
            return Err(InputError::BadBatch(format!(
                "{} KV caches for {} layers per block",
                kv_caches.len(),
                layout.num_slots()
            )));
        }
        self.check_states(input, states)?;
        if let Some(p) = input
            .positions
            .iter()
            .find(|&&p| p >= self.rotary.max_positions())
        {
            return Err(InputError::BadBatch(format!(
                "position {p} is beyond the {} positions the model is sized for (max_model_len)",
                self.rotary.max_positions()
            )));
        }
        let t = input.num_tokens();
        let h = c.hidden_size;
        let meta = AttentionMetadata::groups(input);
        let block_stride = block_size * c.kv_slot_size();
        self.rotary.prepare(&input.positions, &mut buf.rope);
        if let Some(local) = &self.local_rotary {
            local.prepare(&input.positions, &mut buf.rope_local);
        }

        Self::lay_out_delta_seqs(input, &mut buf.delta_seqs);
        self.embed(&input.token_ids, buf)?;
        if let Some(ple) = &self.per_layer_embeddings {
            ple.forward(
                &input.token_ids,
                &buf.hidden,
                &mut buf.ple_scratch,
                &mut buf.ple,
            );
        }
        sized(&mut buf.residual, t * h);
        if c.sandwich_norms {
            sized(&mut buf.normed, t * h);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                buf.residual.copy_from_slice(&buf.hidden);
                layer
                    .input_layernorm
                    .forward(&buf.residual, &mut buf.hidden);
            } else {
                layer
                    .input_layernorm
                    .forward_fused_add(&mut buf.hidden, &mut buf.residual);
            }
            match &layer.mixer {
                Mixer::Attention(a) => {
                    let attn = PagedAttention::new(a.heads, a.kv_heads, a.head_dim, block_size)
                        .with_block_stride(block_stride)
                        .with_scale(c.attention_scale())
                        .with_softcap(c.attn_logit_softcapping)
                        .with_sliding_window(a.window)
                        .with_sinks(a.sinks.as_deref());
                    let at = layout.place(i).expect("an attention layer has K/V");
                    let kv = &mut kv_caches[at.slot];
                    self.attention_block(a, input, &meta[at.group], &attn, kv, buf)?;
                }
                Mixer::Linear { net, state } => {
                    net.forward(
                        &buf.hidden,
                        &buf.delta_seqs,
                        &mut states[*state],
                        &mut buf.delta,
                        &mut buf.mlp_out,
                    );
                    std::mem::swap(&mut buf.hidden, &mut buf.mlp_out);
                }
            }
            if let Some(norm) = &layer.post_attention_norm {
                norm_in_place(norm, buf);
            }
            layer
                .pre_mlp_layernorm
                .forward_fused_add(&mut buf.hidden, &mut buf.residual);
            self.mlp_block(layer, t, buf)?;
            std::mem::swap(&mut buf.hidden, &mut buf.mlp_out);
            if let Some(norm) = &layer.post_mlp_norm {
                norm_in_place(norm, buf);
            }
            // Gemma 4's layer end works on the whole residual stream, so the MLP's output
            // is added there instead of in the next layer's fused norm.
            if layer.per_layer_input.is_some() || layer.layer_scalar.is_some() {
                self.layer_end(layer, i, t, buf);
            }
        }
        self.norm
            .forward_fused_add(&mut buf.hidden, &mut buf.residual);
        Ok(select_rows(
            &input.logits_indices,
            self.config.hidden_size,
            buf,
        ))
    }

    /// The LM head's weights, `[vocab_size, hidden_size]` (this rank's rows of them when the
    /// vocabulary is split): the token embeddings when they are tied.
    pub fn lm_head(&self) -> &WeightMatrix {
        self.lm_head
            .as_ref()
            .map_or(&self.embed_tokens, Linear::weight)
    }

    /// Each token's embedding row; with the vocabulary split, the rank holding a token's
    /// row gives it and the others zeros, summed over the ranks.
    fn embed(&self, tokens: &[u32], buf: &mut ForwardBuffers) -> Result<(), InputError> {
        let h = self.config.hidden_size;
        let hidden = sized(&mut buf.hidden, tokens.len() * h);
        for (row, &tok) in hidden.chunks_exact_mut(h).zip(tokens) {
            match (tok as usize).checked_sub(self.vocab_rows.start) {
                Some(r) if r < self.vocab_rows.len() => self.embed_tokens.row_into(r, row),
                _ => row.fill(0.0),
            }
        }
        self.comm.all_reduce_sum(hidden)?;
        if let Some(m) = self.config.embedding_multiplier {
            hidden.iter_mut().for_each(|x| *x *= m);
        }
        Ok(())
    }

    /// Checks the state stores and slots against the linear-attention layers, and lays
    /// the step's sequences out for them in `buf.delta_seqs`.
    fn check_states(
        &self,
        input: &InputMetadata,
        states: &[LayerStateCache],
    ) -> Result<(), InputError> {
        // Counted and compared in place: this runs every step.
        let layers = self.linear_layers().count();
        if layers == 0 {
            return Ok(());
        }
        let bad = |m: String| Err(InputError::BadBatch(m));
        let sizes_differ =
            (states.iter().zip(self.linear_layers())).any(|(s, net)| !s.holds(net.state_lens()));
        if states.len() != layers || sizes_differ {
            return bad(format!(
                "{} state stores for {layers} linear-attention layers, or of other sizes",
                states.len(),
            ));
        }
        if input.states.len() != input.seqs.len() {
            return bad(format!(
                "{} state slots for {} sequences",
                input.states.len(),
                input.seqs.len()
            ));
        }
        let num_slots = states[0].num_slots();
        let all = || input.states.iter().flat_map(|s| s.slots());
        if let Some(s) = all().find(|&s| s as usize >= num_slots) {
            return bad(format!(
                "state slot {s} outside the cache ({num_slots} slots)"
            ));
        }
        for (i, (st, seq)) in input.states.iter().zip(&input.seqs).enumerate() {
            let snapshot_inside = st
                .snapshot
                .is_none_or(|(after, _)| (1..=seq.query_len).contains(&(after as usize)));
            let fresh = seq.context_len == seq.query_len;
            if !snapshot_inside || (fresh && st.restore_from.is_some()) {
                return bad(format!(
                    "sequence {i}: a state copy outside its step ({st:?}, {} new tokens)",
                    seq.query_len
                ));
            }
        }
        Ok(())
    }

    /// The step's sequences as the linear-attention layers see them (`check_states`
    /// passed): rows, state slot and copies, and whether they start at position 0.
    fn lay_out_delta_seqs(input: &InputMetadata, seqs: &mut Vec<DeltaSeq>) {
        seqs.clear();
        seqs.extend(
            input
                .seqs
                .iter()
                .zip(&input.states)
                .map(|(s, st)| DeltaSeq {
                    rows: s.query_start..s.query_start + s.query_len,
                    slot: st.slot as usize,
                    fresh: s.context_len == s.query_len,
                    restore_from: st.restore_from.map(|r| r as usize),
                    snapshot: st.snapshot.map(|(a, into)| (a as usize, into as usize)),
                }),
        );
    }

    /// Gemma 4's layer end, on the whole residual stream: the MLP's output added, then the
    /// per-layer input's part, then the stream scaled. `hidden` is left zero, so the next
    /// fused add-and-norm (or the final norm) adds nothing more.
    fn layer_end(&self, layer: &DecoderLayer, i: usize, t: usize, buf: &mut ForwardBuffers) {
        let h = self.config.hidden_size;
        let (stream, hidden) = (&mut buf.residual[..t * h], &mut buf.hidden[..t * h]);
        stream
            .iter_mut()
            .zip(hidden.iter())
            .for_each(|(s, x)| *s += x);
        hidden.fill(0.0);
        if let Some(block) = &layer.per_layer_input {
            let (act, projected, normed) = (&mut buf.ple_act, &mut buf.mlp_out, &mut buf.normed);
            block.forward(stream, &buf.ple, i, t, act, projected, normed);
        }
        if let Some(s) = layer.layer_scalar {
            stream.iter_mut().for_each(|x| *x *= s);
        }
    }

    /// Projects only the `n` rows that need logits, left in `buf.last_hidden`: a prompt of
    /// 500 tokens needs one row, and the vocabulary projection is the largest matmul of the
    /// model.
    fn compute_logits<'b>(
        &self,
        n: usize,
        buf: &'b mut ForwardBuffers,
    ) -> Result<&'b [f32], InputError> {
        let (vocab, part) = (self.config.vocab_size, self.local.vocab_size);
        let last = &buf.last_hidden;
        let world = self.comm.world_size();
        let own = sized(
            if world == 1 {
                &mut buf.logits
            } else {
                &mut buf.local_out
            },
            n * part,
        );
        self.lm_head().matmul(last, own, n);
        if let Some(cap) = self.config.final_logit_softcapping {
            // Elementwise, so each rank caps its own columns.
            own.iter_mut().for_each(|x| *x = softcap(*x, cap));
        }
        if world == 1 {
            return Ok(&buf.logits[..n * vocab]);
        }
        // Only rank 0 samples: the others send their columns and keep none.
        let rank0 = self.comm.rank() == 0;
        let logits = sized(&mut buf.logits, if rank0 { n * vocab } else { 0 });
        let own = &buf.local_out[..n * part];
        gather_columns(&*self.comm, Some(0), own, n, vocab, &mut buf.gather, logits)?;
        Ok(&buf.logits[..if rank0 { n * vocab } else { 0 }])
    }
}

/// The hidden states of rows `indices`, copied into `buf.last_hidden`.
fn select_rows<'b>(indices: &[usize], h: usize, buf: &'b mut ForwardBuffers) -> &'b [f32] {
    let last = sized(&mut buf.last_hidden, indices.len() * h);
    for (row, &i) in last.chunks_exact_mut(h).zip(indices) {
        row.copy_from_slice(&buf.hidden[i * h..(i + 1) * h]);
    }
    last
}

/// `hidden = norm(hidden)`, through `normed` (as long as `hidden`), without allocating.
fn norm_in_place(norm: &RmsNorm, buf: &mut ForwardBuffers) {
    norm.forward(&buf.hidden, &mut buf.normed);
    std::mem::swap(&mut buf.hidden, &mut buf.normed);
}
