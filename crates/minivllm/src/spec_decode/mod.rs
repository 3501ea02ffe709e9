//! Speculative decoding's arithmetic shared by a sequence and the scheduler: how each
//! sequence's guesses fare and how many are worth verifying. The proposers themselves run
//! in the worker (`worker/ngram_proposer.rs`).

pub(crate) mod draft_length;
