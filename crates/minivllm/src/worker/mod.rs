//! Turning a schedule into tensors and running the model over the KV cache it owns.

pub mod cache_engine;
pub mod draft_model_proposer;
pub mod draft_proposer;
pub(crate) mod executor;
pub(crate) mod input_batch;
pub mod model_runner;
pub(crate) mod ngram_proposer;
pub(crate) mod step_message;
pub mod worker_config;
pub(crate) mod worker_loop;
pub mod worker_process;
