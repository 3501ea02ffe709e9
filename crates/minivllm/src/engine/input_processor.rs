//! A request on its way in (vLLM v1's `Processor`): its prompt, from either of vLLM's forms
//! to checked token ids, and its parameters checked against the engine's settings.

use std::sync::Arc;

use crate::config::KvRole;
use crate::core::policy::Policy;
use crate::core::scheduler::SchedulerConfig;
use crate::distributed::kv_transfer::KvPayload;
use crate::engine::arg_utils::check_width;
use crate::engine::errors::EngineError;
use crate::engine::kv_transfer::{KvPuller, KvTransfer};
use crate::engine::stop_strings::StopStrings;
use crate::engine::tokenizer::Tokenizer;
use crate::ids::{RequestId, SeqId, TokenId};
use crate::outputs::Arrival;
use crate::sampling_params::{SamplingParams, ValidationError};
use crate::sequence::Sequence;
use crate::structured_output::StructuredOutputGrammar;

/// A prompt in either of vLLM's two forms.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    TokenIds(Vec<TokenId>),
}

impl From<&str> for PromptInput {
    fn from(s: &str) -> Self {
        PromptInput::Text(s.to_string())
    }
}

impl From<String> for PromptInput {
    fn from(s: String) -> Self {
        PromptInput::Text(s)
    }
}

impl From<Vec<TokenId>> for PromptInput {
    fn from(ids: Vec<TokenId>) -> Self {
        PromptInput::TokenIds(ids)
    }
}

/// A prompt ready for the engine: its text when it came as text, and its token ids.
pub(crate) struct ProcessedPrompt {
    pub text: Option<String>,
    pub token_ids: Vec<TokenId>,
}

/// A request that nothing can refuse any more but a duplicate id: its prompt processed,
/// its parameters checked, its grammar compiled (`LLMEngine::prepare_request`).
pub(crate) struct PreparedRequest {
    pub prompt: ProcessedPrompt,
    pub params: CheckedParams,
    pub grammar: Option<Box<dyn StructuredOutputGrammar>>,
    /// Its prompt's KV, pulled from a prefill server and checked against the prompt.
    pub kv_import: Option<Arc<KvPayload>>,
}

/// A request admitted: its sequences for the scheduler, the rest for the output processor.
pub(crate) struct AdmittedRequest {
    pub seqs: Vec<Sequence>,
    pub prompt: ProcessedPrompt,
    pub params: Arc<SamplingParams>,
    pub stop: Option<Arc<StopStrings>>,
    pub arrived: Arrival,
}

impl PreparedRequest {
    /// The request, `arrival`-th in order, as the scheduler and the output processor keep
    /// it: one sequence per completion (`n`, or `best_of`) with ids after `last_seq_id`
    /// (advanced past them), each stopping at `max_tokens` or at the model's context.
    pub(crate) fn admit(
        self,
        request: &RequestId,
        last_seq_id: &mut u64,
        arrival: u64,
        limits: &RequestLimits,
        eos_token_ids: &Arc<[TokenId]>,
    ) -> AdmittedRequest {
        let (priority, arrived) = (self.params.priority(), self.params.arrival());
        let (params, stop) = self.params.into_params_and_stop();
        let prompt = self.prompt;
        let max_tokens = (params.max_tokens.unwrap_or(usize::MAX))
            .min(limits.max_model_len - prompt.token_ids.len());
        let params = Arc::new(params);
        let seqs = (0..params.num_sequences())
            .map(|index| {
                *last_seq_id += 1;
                let id = SeqId(*last_seq_id);
                let mut seq = Sequence::new(id, prompt.token_ids.clone(), priority, arrival)
                    .of_request(request.clone(), index)
                    .with_sampling(Arc::clone(&params), max_tokens, Arc::clone(eos_token_ids));
                // Cached prefix blocks have no logits to score, so the sequence that scores
                // the prompt computes it whole; its siblings then find it in the prefix cache.
                seq.skip_prefix_cache = seq.scores_prompt() || seq.pools_every_position();
                seq.grammar = self.grammar.clone();
                seq.kv_import = self.kv_import.clone();
                seq
            })
            .collect();
        AdmittedRequest {
            seqs,
            prompt,
            params,
            stop,
            arrived,
        }
    }
}

/// What a request must satisfy to run on the engine, beyond the scheduler's settings: its
/// prompt, the model's context and vocabulary; its logprobs, `--max-logprobs`.
#[derive(Debug, Clone)]
pub(crate) struct RequestLimits {
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// `--max-logprobs` ([`ALL_LOGPROBS`](crate::sampling_params::ALL_LOGPROBS) for -1).
    pub max_logprobs: usize,
}

/// The engine's settings a request's parameters are checked against, copied out of the
/// engine so that whoever submits (a route, `LLM`, Python) checks on its own thread, before
/// it spends anything on the request.
#[derive(Debug, Clone)]
pub struct RequestChecks {
    pub(crate) limits: RequestLimits,
    /// The tokenizer's vocabulary (logit biases and allowed tokens name its ids).
    tokenizer_vocab_size: usize,
    /// `--max-num-seqs`: the widest a request may be.
    pub(crate) max_num_seqs: usize,
    policy: Policy,
    /// `--kv-transfer-config`'s role: which `kv_transfer_params` requests may carry.
    kv_role: Option<KvRole>,
    /// A decode server's pulls of prefill servers' KV, made off the engine thread.
    pub(crate) kv_puller: Option<KvPuller>,
}

impl RequestChecks {
    pub(crate) fn new(
        tokenizer: &Tokenizer,
        limits: RequestLimits,
        sched: &SchedulerConfig,
        kv_transfer: Option<&KvTransfer>,
    ) -> Self {
        RequestChecks {
            limits,
            tokenizer_vocab_size: tokenizer.vocab_size(),
            max_num_seqs: sched.max_num_seqs,
            policy: sched.policy,
            kv_role: kv_transfer.map(KvTransfer::role),
            kv_puller: kv_transfer.and_then(KvTransfer::puller),
        }
    }

    /// vLLM's checks of a request's parameters, with its messages: on their own, against the
    /// tokenizer's vocabulary and `--max-logprobs`, its width against `--max-num-seqs`, and a
    /// priority only under the priority policy (under FCFS it would be silently ignored).
    /// The one place they are made: the engine takes the result without checking again.
    pub fn check(
        &self,
        params: SamplingParams,
        priority: i32,
    ) -> Result<CheckedParams, EngineError> {
        params.validate()?;
        params.validate_for_model(self.tokenizer_vocab_size, self.limits.max_logprobs)?;
        check_width(&params, self.max_num_seqs)?;
        if let Some(kv) = &params.kv_transfer_params {
            let role = self.kv_role;
            let (wants, needs, may) = match kv.do_remote_decode {
                true => (
                    "do_remote_decode",
                    "kv_producer",
                    role.is_some_and(KvRole::produces),
                ),
                false => (
                    "do_remote_prefill",
                    "kv_consumer",
                    role.is_some_and(KvRole::consumes),
                ),
            };
            if (kv.do_remote_decode || kv.do_remote_prefill) && !may {
                return Err(ValidationError::new(
                    Some("kv_transfer_params"),
                    format!(
                        "kv_transfer_params.{wants} needs a server started with \
                         --kv-transfer-config and kv_role {needs} or kv_both"
                    ),
                )
                .into());
            }
        }
        if priority != 0 && self.policy != Policy::Priority {
            return Err(ValidationError::new(
                Some("priority"),
                format!("Got priority {priority} but Priority scheduling is not enabled."),
            )
            .into());
        }
        Ok(CheckedParams {
            params,
            priority,
            stop: None,
            arrival: Arrival::now(),
        })
    }
}

/// A request's parameters and priority once [`RequestChecks::check`] passed them; nothing
/// else makes one, so the engine admits it without checking again.
#[derive(Debug, Clone)]
pub struct CheckedParams {
    params: SamplingParams,
    priority: i32,
    /// The stop strings' automaton, once [`with_stop_strings`](Self::with_stop_strings)
    /// built it; clones share it.
    stop: Option<Arc<StopStrings>>,
    /// Stamped by the check: the request's arrival.
    arrival: Arrival,
}

impl CheckedParams {
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn priority(&self) -> i32 {
        self.priority
    }

    pub(crate) fn arrival(&self) -> Arrival {
        self.arrival
    }

    /// The same request with its stop strings' automaton built, for a caller that builds
    /// it on a thread of its own (the server, once the request's memory is reserved): the
    /// engine and every copy of these parameters (one per prompt) then share it. The engine
    /// builds it at admission otherwise.
    pub(crate) fn with_stop_strings(mut self) -> Self {
        if self.stop.is_none() {
            self.stop = StopStrings::new(&self.params.stop);
        }
        self
    }

    /// [`with_stop_strings`](Self::with_stop_strings), sharing the automaton of `previous`
    /// (a batch's previous prompt) where both have the same stop strings: a batch of prompts
    /// with one set of parameters builds one.
    pub fn with_stop_strings_of(mut self, previous: Option<&CheckedParams>) -> Self {
        if let Some(prev) =
            previous.filter(|p| self.stop.is_none() && p.params.stop == self.params.stop)
        {
            self.stop.clone_from(&prev.stop);
        }
        self.with_stop_strings()
    }

    /// The parameters and the stop strings' automaton, built here if no one built it.
    pub(crate) fn into_params_and_stop(self) -> (SamplingParams, Option<Arc<StopStrings>>) {
        let built = self.with_stop_strings();
        (built.params, built.stop)
    }

    /// The same request with its output budget fixed for one prompt (`max_tokens_for`):
    /// the budget's own rules are checked again, nothing else changed.
    pub(crate) fn with_max_tokens(mut self, max_tokens: usize) -> Result<Self, EngineError> {
        self.params.max_tokens = Some(max_tokens);
        self.params.check_max_tokens()?;
        Ok(self)
    }
}

/// Tokenises a text prompt and checks the ids against the model: never empty, within the
/// context, every id in the vocabulary.
pub(crate) fn process_prompt(
    tokenizer: &Tokenizer,
    prompt: PromptInput,
    limits: &RequestLimits,
) -> Result<ProcessedPrompt, EngineError> {
    let (text, token_ids) = match prompt {
        PromptInput::Text(t) => {
            let ids = tokenizer.encode(&t, true)?;
            (Some(t), ids)
        }
        PromptInput::TokenIds(ids) => (None, ids),
    };
    if token_ids.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if token_ids.len() > limits.max_model_len {
        return Err(EngineError::PromptTooLong {
            len: token_ids.len(),
            max_model_len: limits.max_model_len,
        });
    }
    if let Some(&token) = token_ids.iter().find(|&&t| t as usize >= limits.vocab_size) {
        return Err(EngineError::TokenOutOfVocab {
            token,
            vocab_size: limits.vocab_size,
        });
    }
    Ok(ProcessedPrompt { text, token_ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unbuilt(stop: &[&str]) -> CheckedParams {
        let params = SamplingParams {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..SamplingParams::default()
        };
        CheckedParams {
            params,
            priority: 0,
            stop: None,
            arrival: Arrival::now(),
        }
    }

    #[test]
    fn a_requests_copies_share_its_stop_strings_built_once() {
        let checked = unbuilt(&["END", "STOP"]).with_stop_strings();
        let copies = [checked.clone(), checked.clone().with_max_tokens(3).unwrap()];
        let [a, b] = copies.map(|c| c.into_params_and_stop().1.expect("built"));
        assert!(Arc::ptr_eq(&a, &b));
        // The next prompt of a batch shares it where its list is the same.
        let next = unbuilt(&["END", "STOP"]).with_stop_strings_of(Some(&checked));
        assert!(Arc::ptr_eq(&a, &next.into_params_and_stop().1.unwrap()));
        let other = unbuilt(&["END"]).with_stop_strings_of(Some(&checked));
        assert!(!Arc::ptr_eq(&a, &other.into_params_and_stop().1.unwrap()));
        // Unbuilt, the engine builds it at admission; none for no (or only empty) strings.
        assert!(unbuilt(&["END"]).into_params_and_stop().1.is_some());
        assert!(unbuilt(&[""])
            .with_stop_strings()
            .into_params_and_stop()
            .1
            .is_none());
        assert!(unbuilt(&[]).into_params_and_stop().1.is_none());
    }
}
