//! What the sampler needs to know about one sequence's settings, distilled by the engine
//! from the request's `SamplingParams` (vLLM's `SamplingMetadata`): plain numbers and
//! borrowed lists, so that no request object reaches the model executor.

use std::collections::BTreeMap;

use crate::ids::TokenId;

/// One sequence's sampling settings for a step, borrowed from its request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SamplingOptions<'a> {
    /// Take the argmax (vLLM: temperature below its epsilon).
    pub greedy: bool,
    pub temperature: f32,
    /// `None`: no top-k cut.
    pub top_k: Option<usize>,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub logit_bias: &'a BTreeMap<TokenId, f32>,
    /// EOS and `stop_token_ids` are banned until this many tokens have been generated.
    pub min_tokens: usize,
    pub stop_token_ids: &'a [TokenId],
    /// How many top logprobs to report per sampled token.
    pub logprobs: Option<usize>,
}

/// The tokens a sequence may sample next, one bit per vocabulary entry (vLLM v1's grammar
/// bitmask, filled by a structured-output grammar); every other token's logit is set to
/// `-inf` before anything else, so the logprobs reported are those of the masked logits,
/// as vLLM reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBitmask {
    words: Vec<u32>,
}

impl TokenBitmask {
    /// Nothing allowed yet, over `vocab_size` tokens.
    pub fn new(vocab_size: usize) -> Self {
        Self {
            words: vec![0; vocab_size.div_ceil(32)],
        }
    }

    /// The mask whose word `i` holds tokens `32 i ..= 32 i + 31`, lowest bit first.
    pub(crate) fn from_words(words: Vec<u32>) -> Self {
        Self { words }
    }

    /// Allows `token`; ids past the vocabulary are ignored.
    pub fn allow(&mut self, token: TokenId) {
        if let Some(w) = self.words.get_mut(token as usize / 32) {
            *w |= 1 << (token % 32);
        }
    }

    pub fn is_allowed(&self, token: TokenId) -> bool {
        self.words
            .get(token as usize / 32)
            .is_some_and(|w| w & (1 << (token % 32)) != 0)
    }

    /// Sets every disallowed entry of `row` to `-inf` (a row longer than the mask loses
    /// its tail).
    pub(crate) fn apply(&self, row: &mut [f32]) {
        for (chunk, &w) in row
            .chunks_mut(32)
            .zip(self.words.iter().chain(std::iter::repeat(&0)))
        {
            // A grammar allows few tokens: most words are empty, and whole.
            match w {
                0 => chunk.fill(f32::NEG_INFINITY),
                u32::MAX => {}
                _ => {
                    // A select rather than a branch per bit, so that it vectorises: a mask
                    // allowing a third of the vocabulary at random took 2 ms a step of 16.
                    for (bit, l) in chunk.iter_mut().enumerate() {
                        let keep = (w >> bit) & 1 != 0;
                        *l = if keep { *l } else { f32::NEG_INFINITY };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_keeps_exactly_its_tokens_in_empty_full_mixed_and_tail_words() {
        // 100 logits: word 0 empty, word 1 full, word 2 mixed, word 3 a 4-entry tail.
        let mut mask = TokenBitmask::new(100);
        let allowed: Vec<TokenId> = (32..64).chain([65, 70, 95, 97, 99]).collect();
        for &t in &allowed {
            mask.allow(t);
        }
        let mut row: Vec<f32> = (0..100).map(|i| i as f32).collect();
        mask.apply(&mut row);
        for (i, &l) in row.iter().enumerate() {
            let want = if allowed.contains(&(i as TokenId)) {
                i as f32
            } else {
                f32::NEG_INFINITY
            };
            assert_eq!(l, want, "logit {i}");
        }
        // A row longer than the mask loses its tail.
        let mut long = vec![1.0; 140];
        TokenBitmask::from_words(vec![u32::MAX; 4]).apply(&mut long);
        assert!(long[..128].iter().all(|&l| l == 1.0));
        assert!(long[128..].iter().all(|&l| l == f32::NEG_INFINITY));
    }
}
