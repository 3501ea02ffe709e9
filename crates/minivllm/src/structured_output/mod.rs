//! The seam structured output plugs into (vLLM v1's `StructuredOutputGrammar`): a grammar
//! attached to a sequence says, before each token the sequence samples, which tokens may
//! come next, and follows each token sampled. The scheduler asks it for the step's mask
//! (`SchedulerOutput::token_masks`), the worker's sampler applies the mask, and the
//! scheduler advances the grammar with the token. A grammar that has reached its end
//! allows only EOS, so the sequence stops as any other does.
//!
//! The grammars come from a request's `StructuredOutputsParams` (JSON schema, regex,
//! choice, Lark grammar), compiled by llguidance (`backend_guidance.rs`) over the model's
//! vocabulary as bytes (`vocabulary.rs`).

use std::fmt::Debug;

use crate::ids::TokenId;
pub use crate::model_executor::sampling_metadata::TokenBitmask;

pub mod backend_guidance;
pub mod vocabulary;

pub trait StructuredOutputGrammar: Debug + Send {
    /// The tokens allowed next (only EOS once the grammar is done, or broken).
    fn token_mask(&mut self) -> TokenBitmask;
    /// Follows a sampled token (one the mask allowed).
    fn accept_token(&mut self, token: TokenId);
    /// Whether nothing but EOS may follow (the constraint is complete, or broken): the
    /// sequence then stops.
    fn is_terminated(&self) -> bool {
        false
    }
    /// A fresh copy for another completion of the same request (`n > 1`).
    fn box_clone(&self) -> Box<dyn StructuredOutputGrammar>;
}

impl Clone for Box<dyn StructuredOutputGrammar> {
    fn clone(&self) -> Self {
        self.box_clone()
    }
}
