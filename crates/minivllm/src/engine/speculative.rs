//! Starting speculative decoding from `--speculative-config`: the proposer it names, a draft
//! model checked against the target (same tokenizer, same vocabulary size, context enough),
//! and the limits the scheduler keeps its drafts within.

use crate::config::SpeculativeMethodConfig;
use crate::engine::arg_utils::EngineArgs;
use crate::engine::errors::EngineError;
use crate::engine::tokenizer::{load_tokenizer, Tokenizer};
use crate::spec_decode::draft_length::DraftLimits;
use crate::worker::draft_model_proposer::DraftModelProposer;
use crate::worker::draft_proposer::DraftProposer;
use crate::worker::executor::Executor;
use crate::worker::ngram_proposer::NgramProposer;

/// The proposer `method` names, and its limits.
pub(crate) fn start_proposer(
    method: &SpeculativeMethodConfig,
    args: &EngineArgs,
    executor: &Executor,
    tokenizer: &Tokenizer,
) -> Result<(Box<dyn DraftProposer>, DraftLimits), EngineError> {
    let limits = DraftLimits {
        max_draft_len: method.num_speculative_tokens(),
        disable_by_batch_size: method.disable_by_batch_size(),
        adaptive: (args.speculative_config.as_ref())
            .and_then(|c| c.adaptive_draft_length)
            .unwrap_or(true),
    };
    let proposer: Box<dyn DraftProposer> = match method {
        SpeculativeMethodConfig::Ngram(c) => Box::new(NgramProposer::new(*c)),
        SpeculativeMethodConfig::DraftModel(c) => {
            let draft_tokenizer = load_tokenizer(&c.model)?;
            let (ours, theirs) = (tokenizer.inner(), draft_tokenizer.inner());
            if ours.get_vocab(true) != theirs.get_vocab(true) {
                return Err(EngineError::Config(format!(
                    "the draft model {} does not share the target's vocabulary ({} tokens \
                     against {}): speculative decoding needs the same tokenizer",
                    c.model,
                    theirs.get_vocab_size(true),
                    ours.get_vocab_size(true)
                )));
            }
            let cache = executor.cache();
            let draft = DraftModelProposer::load(
                c,
                &args.load,
                executor.max_model_len(),
                cache.block_size(),
                cache.num_blocks(),
                cache.dtype(),
            )?;
            let target_vocab = executor.model().config().vocab_size;
            if draft.vocab_size() != target_vocab {
                return Err(EngineError::Config(format!(
                    "the draft model {} has {} logits, the target {target_vocab}: speculative \
                     decoding needs the same vocabulary size",
                    c.model,
                    draft.vocab_size()
                )));
            }
            tracing::info!(draft = %c.model, k = c.num_speculative_tokens, "draft model loaded");
            Box::new(draft)
        }
    };
    Ok((proposer, limits))
}
