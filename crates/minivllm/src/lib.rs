//! mini-vllm: an LLM inference engine in the line of vLLM.
//!
//! The path of one step: the engine (`engine/`) asks the scheduler (`core/`) which
//! sequences run, the worker (`worker/`) turns that schedule into the model's input
//! metadata and runs the model (`model_executor/`) over a paged KV cache, and the sampler
//! picks the next tokens.

pub use minivllm_kernels as kernels;

pub mod config;
pub mod core;
pub mod distributed;
pub mod engine;
pub mod entrypoints;
pub mod ids;
pub mod model_executor;
pub mod outputs;
pub mod reasoning;
pub mod sampling_params;
pub mod sequence;
pub(crate) mod spec_decode;
pub mod structured_output;
#[doc(hidden)]
pub mod testing;
pub mod utils;
pub mod worker;
