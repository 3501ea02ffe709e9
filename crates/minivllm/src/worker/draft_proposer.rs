//! The seam speculative decoding plugs into: a proposer guesses the tokens that follow a
//! sequence (vLLM v1's n-gram or draft-model proposers); the scheduler feeds its guesses to
//! the next step after the sequence's last token, and the worker keeps those that match
//! what it samples at their positions (`ModelRunner::execute`). Plain decoding's tokens
//! come out either way; good guesses give several per step.

use crate::ids::{SeqId, TokenId};

pub trait DraftProposer: Send {
    /// At most `max_len` tokens guessed to follow `token_ids` (the sequence's prompt and
    /// output so far); empty for no guess.
    fn propose(&mut self, seq: SeqId, token_ids: &[TokenId], max_len: usize) -> Vec<TokenId>;

    /// The most tokens it guesses at once (`num_speculative_tokens`).
    fn max_draft_len(&self) -> usize;

    /// The sequences finished: whatever it keeps for them can go.
    fn forget(&mut self, _seqs: &[SeqId]) {}
}
