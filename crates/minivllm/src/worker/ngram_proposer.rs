//! Prompt lookup decoding (vLLM v1's `NgramProposer`): the tokens that followed the latest
//! earlier occurrence of the sequence's final n-gram, longest n first. Where the output
//! repeats the prompt (editing code, quoting a document) the guesses are right for long
//! runs; where it does not, nothing is found and nothing is proposed.

use crate::config::NgramConfig;
use crate::ids::{SeqId, TokenId};
use crate::worker::draft_proposer::DraftProposer;

#[derive(Debug, Clone)]
pub(crate) struct NgramProposer {
    config: NgramConfig,
}

impl NgramProposer {
    pub fn new(config: NgramConfig) -> Self {
        Self { config }
    }
}

impl DraftProposer for NgramProposer {
    fn propose(&mut self, _: SeqId, token_ids: &[TokenId], max_len: usize) -> Vec<TokenId> {
        let mut drafts = propose(&self.config, token_ids);
        drafts.truncate(max_len);
        drafts
    }

    fn max_draft_len(&self) -> usize {
        self.config.num_speculative_tokens
    }
}

fn propose(c: &NgramConfig, tokens: &[TokenId]) -> Vec<TokenId> {
    let len = tokens.len();
    for n in (c.prompt_lookup_min..=c.prompt_lookup_max.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        // The latest earlier match: the one nearest the text being written.
        let found = (0..len - n)
            .rev()
            .find(|&start| &tokens[start..start + n] == suffix);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + c.num_speculative_tokens).min(len);
            return tokens[from..to].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(k: usize, min: usize, max: usize) -> NgramConfig {
        NgramConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
            disable_by_batch_size: None,
        }
    }

    #[test]
    fn the_longest_latest_match_proposes_what_followed_it() {
        //            0  1  2  3  4  5  6  7  8  9
        let tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3];
        // Bigram [2, 3]: latest earlier match at 5, followed by 5, 6, 2.
        assert_eq!(propose(&cfg(3, 1, 3), &tokens), [5, 6, 2]);
        // A trigram [6, 2, 3] has no earlier match; with min 3 nothing is proposed.
        assert!(propose(&cfg(3, 3, 3), &tokens).is_empty());
        // Near the end fewer than k tokens follow.
        assert_eq!(propose(&cfg(5, 2, 2), &[7, 8, 7, 8]), [7, 8]);
        assert!(propose(&cfg(3, 1, 3), &[4]).is_empty());
        assert!(propose(&cfg(3, 1, 3), &[]).is_empty());
    }
}
