//! Turning a schedule into tensors and running the model over the KV cache it owns.

pub mod cache_engine;
pub mod draft_model_proposer;
pub mod draft_proposer;
pub mod executor;
pub mod input_batch;
pub mod model_runner;
pub mod ngram_proposer;
pub mod step_message;
pub mod worker_config;
pub mod worker_loop;
pub mod worker_process;
