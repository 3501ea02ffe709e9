//! Why the engine refused a request or could not start.

use crate::engine::tokenizer::TokenizerError;
use crate::model_executor::input_metadata::InputError;
use crate::model_executor::loader::LoadError;
use crate::sampling_params::ValidationError;
use crate::sequence::TokenId;
use crate::structured_output::backend_guidance::GrammarError;
use crate::worker::worker_config::WorkerError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("invalid engine arguments: {0}")]
    Config(String),
    #[error(transparent)]
    Validation(#[from] ValidationError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the decoder prompt (length {len}) is longer than the maximum model length of {max_model_len}"
    )]
    PromptTooLong { len: usize, max_model_len: usize },
    #[error("token id {token} is out of vocabulary (size {vocab_size})")]
    TokenOutOfVocab { token: TokenId, vocab_size: usize },
    #[error("request id {0:?} is already in use")]
    DuplicateRequest(String),
    #[error(
        "the request asks for {width} sequences (n, or best_of when larger), more than \
         --max-num-seqs {max_num_seqs}: all of a request's sequences must fit in one batch"
    )]
    TooManySequences { width: usize, max_num_seqs: usize },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("model input: {0}")]
    Input(#[from] InputError),
    /// The request's structured-output constraint does not compile.
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    /// The executor could not load the model, allocate its KV cache or reach its ranks.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    KvEvents(#[from] crate::core::kv_event_publisher::KvEventsError),
    /// Prefill/decode disaggregation could not start, or a request's KV could not be
    /// pulled (with `kv_load_failure_policy` "fail").
    #[error("KV transfer: {0}")]
    KvTransfer(String),
}
