//! The seam structured output plugs into (vLLM v1's `StructuredOutputGrammar`): a grammar
//! attached to a sequence says, before each token the sequence samples, which tokens may
//! come next, and follows each token sampled. The scheduler asks it for the step's mask
//! (`SchedulerOutput::token_masks`), the worker's sampler applies the mask, and the
//! scheduler advances the grammar with the token. A grammar that has reached its end
//! allows only EOS, so the sequence stops as any other does; one that broke allows only EOS
//! too, and its sequence ends with `finish_reason: "error"`.
//!
//! The grammars come from a request's `StructuredOutputsParams` (JSON schema, regex,
//! choice, Lark grammar), compiled by llguidance (`backend_guidance.rs`) over the model's
//! vocabulary as bytes (`vocabulary.rs`).

use std::fmt::Debug;

use crate::ids::TokenId;
pub use crate::model_executor::sampling_metadata::TokenBitmask;

pub mod backend_guidance;
pub(crate) mod limits;
pub(crate) mod strict_schema;
pub mod vocabulary;

/// What structured output has cost: the tokens constrained (one mask each) and the
/// seconds spent computing their masks and advancing the grammars with them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GrammarStats {
    pub num_token_masks: u64,
    pub mask_seconds: f64,
    pub accept_seconds: f64,
}

impl GrammarStats {
    /// Microseconds per constrained token of the mask, and of the grammar's advance.
    pub fn per_token_us(&self) -> (f64, f64) {
        let n = self.num_token_masks.max(1) as f64;
        (self.mask_seconds * 1e6 / n, self.accept_seconds * 1e6 / n)
    }
}

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
    /// Why the grammar broke (over its limits mid-generation): the sequence then ends with
    /// an error finish.
    fn error(&self) -> Option<String> {
        None
    }
    /// A fresh copy for another completion of the same request (`n > 1`).
    fn box_clone(&self) -> Box<dyn StructuredOutputGrammar>;
}

impl Clone for Box<dyn StructuredOutputGrammar> {
    fn clone(&self) -> Self {
        self.box_clone()
    }
}
