//! The seam structured output plugs into (vLLM v1's `StructuredOutputGrammar`): a grammar
//! attached to a sequence says, before each token the sequence samples, which tokens may
//! come next, and follows each token sampled. The scheduler asks it for the step's mask
//! (`SchedulerOutput::token_masks`), the worker's sampler applies the mask, and the
//! scheduler advances the grammar with the token. A grammar that has reached its end
//! allows only EOS, so the sequence stops as any other does.
//!
//! The grammars themselves (JSON schema, regex, choice) are the structured-output
//! feature's; what is here is the contract and its place in the step.

use std::fmt::Debug;

use crate::ids::TokenId;
pub use crate::model_executor::sampling_metadata::TokenBitmask;

pub trait StructuredOutputGrammar: Debug + Send {
    /// The tokens allowed next.
    fn token_mask(&self) -> TokenBitmask;
    /// Follows a sampled token (one the mask allowed).
    fn accept_token(&mut self, token: TokenId);
    /// A fresh copy for another completion of the same request (`n > 1`).
    fn box_clone(&self) -> Box<dyn StructuredOutputGrammar>;
}

impl Clone for Box<dyn StructuredOutputGrammar> {
    fn clone(&self) -> Self {
        self.box_clone()
    }
}
