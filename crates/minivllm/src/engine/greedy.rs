//! A plain greedy generation loop over the model runner: every admitted sequence advances
//! one token per step, all in one batch (prompts prefilled together in the first step).
//! The scheduler-driven `LLMEngine` supersedes it; it stays as the simplest consumer of
//! the model and a reference for batch-invariance tests.

use crate::core::block_pool::{BlockId, BlockPool};
use crate::model_executor::input_metadata::{InputError, InputMetadata};
use crate::worker::model_runner::ModelRunner;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was generated (it is included in the output).
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GreedyOutput {
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("prompt {index} is empty")]
    EmptyPrompt { index: usize },
    #[error(
        "prompt {index} is {len} tokens, longer than the maximum model length of {max_model_len}"
    )]
    PromptTooLong {
        index: usize,
        len: usize,
        max_model_len: usize,
    },
    #[error("prompt {index} needs {needed} KV blocks but the cache has only {total}; raise --kv-cache-memory")]
    CacheTooSmall {
        index: usize,
        needed: usize,
        total: usize,
    },
    #[error(transparent)]
    Input(#[from] InputError),
}

struct Active {
    index: usize,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose K/V are already in the cache.
    computed: usize,
    blocks: Vec<BlockId>,
    table: Vec<u32>,
    target_len: usize,
}

/// Greedily extends each prompt by up to `max_tokens` tokens, stopping at any of
/// `eos_token_ids` or at `max_model_len` total tokens. Outputs are in input order.
pub fn generate_greedy(
    runner: &mut ModelRunner,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    eos_token_ids: &[u32],
    max_model_len: usize,
) -> Result<Vec<GreedyOutput>, GenerateError> {
    let block_size = runner.cache().block_size();
    let mut pool = BlockPool::new(runner.cache().num_blocks());
    let target_len = |p: &Vec<u32>| (p.len() + max_tokens).min(max_model_len);
    for (index, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(GenerateError::EmptyPrompt { index });
        }
        if p.len() > max_model_len {
            return Err(GenerateError::PromptTooLong {
                index,
                len: p.len(),
                max_model_len,
            });
        }
        let needed = target_len(p).div_ceil(block_size);
        if needed > pool.num_blocks() {
            return Err(GenerateError::CacheTooSmall {
                index,
                needed,
                total: pool.num_blocks(),
            });
        }
    }
    let mut outputs: Vec<Option<GreedyOutput>> = vec![None; prompts.len()];
    let mut input = InputMetadata::default();
    let mut next = 0;
    while next < prompts.len() {
        let mut active = Vec::new();
        // Admit prompts in order while their whole budget of blocks fits.
        while next < prompts.len() {
            let p = &prompts[next];
            let Some(blocks) = pool.allocate(target_len(p).div_ceil(block_size)) else {
                break;
            };
            active.push(Active {
                index: next,
                tokens: p.clone(),
                prompt_len: p.len(),
                computed: 0,
                table: blocks.iter().map(|b| b.0).collect(),
                blocks,
                target_len: target_len(p),
            });
            next += 1;
        }
        while !active.is_empty() {
            step(runner, &mut input, &mut active, block_size, max_tokens)?;
            let mut i = 0;
            while i < active.len() {
                let a = &active[i];
                let last = *a.tokens.last().expect("non-empty");
                let generated = a.tokens.len() - a.prompt_len;
                let finish = if generated > 0 && eos_token_ids.contains(&last) {
                    Some(FinishReason::Stop)
                } else if a.tokens.len() >= a.target_len || generated >= max_tokens {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                if let Some(finish_reason) = finish {
                    let a = active.swap_remove(i);
                    pool.free(a.blocks);
                    outputs[a.index] = Some(GreedyOutput {
                        token_ids: a.tokens[a.prompt_len..].to_vec(),
                        finish_reason,
                    });
                } else {
                    i += 1;
                }
            }
        }
    }
    Ok(outputs
        .into_iter()
        .map(|o| o.expect("every prompt finishes"))
        .collect())
}

/// One forward over every active sequence's uncomputed tokens, appending the argmax.
fn step(
    runner: &mut ModelRunner,
    input: &mut InputMetadata,
    active: &mut [Active],
    block_size: usize,
    max_tokens: usize,
) -> Result<(), GenerateError> {
    input.clear();
    for a in active.iter() {
        input.add_sequence(
            &a.tokens[a.computed..],
            a.tokens.len(),
            &a.table,
            block_size,
            true,
        );
    }
    let logits = runner.execute(input)?;
    let vocab = logits.len() / active.len();
    for (a, row) in active.iter_mut().zip(logits.chunks_exact(vocab)) {
        a.computed = a.tokens.len();
        if max_tokens > 0 {
            a.tokens.push(argmax(row));
        }
    }
    Ok(())
}

/// Index of the largest value, the first one on ties (as `torch.argmax`).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}
