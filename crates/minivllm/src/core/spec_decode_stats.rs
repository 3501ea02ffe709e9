//! What speculative decoding has achieved (vLLM v1's `SpecDecodingStats`): the drafts the
//! scheduler fed, their tokens, and how many the target model kept, by position.

use crate::config::MAX_SPECULATIVE_TOKENS;

/// Copied with the engine's stats every step: fixed-size, so that costs no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecDecodingStats {
    /// Sequence-steps that carried draft tokens.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// `[i]`: drafts whose token at position `i` was kept.
    pub num_accepted_tokens_per_pos: [u64; MAX_SPECULATIVE_TOKENS],
    /// The longest draft seen: the positions worth reporting.
    pub max_draft_len: usize,
}

impl SpecDecodingStats {
    /// One draft of `num_draft_tokens`, of which the first `num_accepted` were kept.
    pub(crate) fn observe(&mut self, num_draft_tokens: usize, num_accepted: usize) {
        let num_draft_tokens = num_draft_tokens.min(MAX_SPECULATIVE_TOKENS);
        let accepted = num_accepted.min(num_draft_tokens);
        self.num_drafts += 1;
        self.num_draft_tokens += num_draft_tokens as u64;
        self.num_accepted_tokens += accepted as u64;
        self.max_draft_len = self.max_draft_len.max(num_draft_tokens);
        for n in &mut self.num_accepted_tokens_per_pos[..accepted] {
            *n += 1;
        }
    }

    /// Kept draft tokens over proposed ones.
    pub fn acceptance_rate(&self) -> f64 {
        self.num_accepted_tokens as f64 / self.num_draft_tokens.max(1) as f64
    }

    /// Tokens a drafted step gives on average (vLLM's mean acceptance length): the kept
    /// drafts plus the one the model samples itself.
    pub fn mean_acceptance_length(&self) -> f64 {
        1.0 + self.num_accepted_tokens as f64 / self.num_drafts.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_count_by_position() {
        let mut s = SpecDecodingStats::default();
        s.observe(3, 2);
        s.observe(4, 0);
        s.observe(2, 5);
        assert_eq!(
            (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens),
            (3, 9, 4)
        );
        assert_eq!(
            s.num_accepted_tokens_per_pos[..s.max_draft_len],
            [2, 2, 0, 0]
        );
        assert!((s.mean_acceptance_length() - (1.0 + 4.0 / 3.0)).abs() < 1e-12);
        assert!((s.acceptance_rate() - 4.0 / 9.0).abs() < 1e-12);
    }
}
