//! Runs the model on one batch over the KV cache.

use crate::ids::{BlockId, CpuBlockId};
use crate::model_executor::input_metadata::{InputError, InputMetadata};
use crate::model_executor::models::llama::{ForwardBuffers, LlamaForCausalLM};
use crate::worker::cache_engine::CacheEngine;

/// The model, its KV cache and the activation buffers reused from step to step.
pub struct ModelRunner {
    model: LlamaForCausalLM,
    cache: CacheEngine,
    buffers: ForwardBuffers,
}

impl ModelRunner {
    pub fn new(model: LlamaForCausalLM, cache: CacheEngine) -> Self {
        Self {
            model,
            cache,
            buffers: ForwardBuffers::default(),
        }
    }

    pub fn model(&self) -> &LlamaForCausalLM {
        &self.model
    }

    pub fn cache(&self) -> &CacheEngine {
        &self.cache
    }

    pub fn copy_blocks(&mut self, pairs: &[(BlockId, BlockId)]) {
        if !pairs.is_empty() {
            self.cache.copy_blocks(pairs);
        }
    }

    pub fn swap_out(&mut self, pairs: &[(BlockId, CpuBlockId)]) {
        if !pairs.is_empty() {
            self.cache.swap_out(pairs);
        }
    }

    pub fn swap_in(&mut self, pairs: &[(CpuBlockId, BlockId)]) {
        if !pairs.is_empty() {
            self.cache.swap_in(pairs);
        }
    }

    /// Logits `[input.logits_indices.len(), vocab_size]` for the batch.
    pub fn execute(&mut self, input: &InputMetadata) -> Result<&[f32], InputError> {
        let block_size = self.cache.block_size();
        let (model, cache, buffers) = (&self.model, &mut self.cache, &mut self.buffers);
        minivllm_kernels::threading::install(|| {
            model.forward(input, cache.layers_mut(), block_size, buffers)
        })
    }
}
