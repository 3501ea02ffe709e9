//! What one request may make the server hold, checked before any work is queued, and the
//! memory given back to the system once large requests end.
//!
//! A request's memory is bounded by its fields, not its body size: a 5 KB body asking for
//! 256 completions with 20 logprobs over an echoed 800-token prompt builds a 113 MB
//! response, and 24 prompts sharing a 4 MB stop list copy it 24 times. Each request's
//! worst case is estimated from its fields and refused (400) above `--max-request-memory`;
//! what requests in flight hold together is bounded too (503 while the pool is full), so
//! many requests each within the limit cannot add up past the machine's memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;

use super::protocol::ApiError;
use crate::engine::stop_strings::StopStrings;
use crate::sampling_params::SamplingParams;
use crate::utils::allocator::{release_free_memory, resident_bytes};
use crate::utils::proc_kib_field;

/// Bytes per logprob entry of a completions response (a position's alternative: the
/// engine's entry, the JSON object's key and value while the response is built, and its
/// text), measured on `/v1/completions` with `echo` and rounded up (303 with
/// `logprobs: -1`).
const LOGPROB_ENTRY_BYTES: u64 = 320;
/// The same for chat's entries (`{token, logprob, bytes, top_logprobs}` objects, the bytes
/// a list of numbers): 2,173 bytes at the peak, measured with `top_logprobs: -1` over 8
/// tokens (1,360 streamed).
const CHAT_LOGPROB_ENTRY_BYTES: u64 = 2_304;
/// The Responses route's, which reads chat's entries back and repeats them in its events
/// (each delta's, then the text's `done`, the part's, the item's and `response.completed`):
/// 8,667 bytes streamed, 3,731 whole, measured as above.
const RESPONSES_LOGPROB_ENTRY_BYTES: u64 = 9_216;
/// An entry of vLLM's `prompt_logprobs` object (`{id: {logprob, rank, decoded_token}}`),
/// built per choice whenever `prompt_logprobs` is set: 1,332 bytes measured with -1 on
/// completions (964 on chat).
const PROMPT_LOGPROB_ENTRY_BYTES: u64 = 1_408;

/// How a route writes logprobs into its response, for the estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogprobFormat {
    /// `/v1/completions`: a `{text: logprob}` map per position.
    Completions,
    /// Chat's entries (the Anthropic route asks for none).
    Chat,
    /// The Responses route's `output_text.logprobs`, repeated in its stream's events.
    Responses,
}

impl LogprobFormat {
    fn entry_bytes(self) -> u64 {
        match self {
            LogprobFormat::Completions => LOGPROB_ENTRY_BYTES,
            LogprobFormat::Chat => CHAT_LOGPROB_ENTRY_BYTES,
            LogprobFormat::Responses => RESPONSES_LOGPROB_ENTRY_BYTES,
        }
    }
}
/// The tokenizer's working memory at its peak, per byte of text, measured with 2 MB texts
/// through `/tokenize` (`return_token_strs` too) on SmolLM2's tokenizer: 266 bytes for
/// `"a "` repeated (a word per two bytes, 532 bytes per token), 128 for digits (a token per
/// byte); rounded up.
pub(crate) const TOKENIZE_BYTES_PER_BYTE: u64 = 320;
/// Bytes per generated token of one sequence: its id, text, and share of the response.
const TOKEN_BYTES: u64 = 64;
/// Bytes per prompt token held per prompt (ids, and the text echoed in each choice).
const PROMPT_TOKEN_BYTES: u64 = 16;
/// A `logit_bias` entry in the engine's map.
const BIAS_ENTRY_BYTES: u64 = 48;

/// One prompt of a request, as the estimate sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PromptShape {
    pub tokens: usize,
    /// Its output budget (`max_tokens` after the context check).
    pub max_tokens: usize,
}

/// What a route's response holds of a request, for the estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResponseShape {
    /// Every choice repeats its prompt (completions' `echo`), with its logprobs when
    /// `prompt_logprobs` is set.
    pub echo: bool,
    /// vLLM's `prompt_logprobs` objects written per prompt: one per choice (completions),
    /// one (chat), none where the client did not ask for the field.
    pub prompt_logprobs_objects: u64,
    pub format: LogprobFormat,
}

/// The most a request may make the server hold: its prompts' copies of the sampling
/// parameters, the stop strings' automaton (one per request), and each sequence's tokens,
/// logprobs and share of the response, as `shape` says the route writes them. Prompt
/// logprobs also need a row of `vocab_size` logits per prompt token in the step that
/// scores them.
pub fn estimate(
    params: &SamplingParams,
    prompts: &[PromptShape],
    shape: ResponseShape,
    vocab_size: usize,
) -> u64 {
    let stop_bytes: usize = params.stop.iter().map(String::len).sum();
    let automaton = if stop_bytes > 0 {
        StopStrings::bytes_for(stop_bytes, params.stop.len()) as u64
    } else {
        0
    };
    let per_prompt_params = (stop_bytes + params.stop.len() * std::mem::size_of::<String>()) as u64
        + 4 * params.stop_token_ids.len() as u64
        + BIAS_ENTRY_BYTES * params.logit_bias.len() as u64;
    let seqs = params.num_sequences() as u64;
    let choices = params.n as u64;
    // A count past the vocabulary (-1 asks for all of it) reports the vocabulary.
    let width = |k: Option<usize>| k.map_or(0, |k| k.min(vocab_size) as u64 + 1);
    let logprob_width = width(params.logprobs);
    let prompt_width = width(params.prompt_logprobs);
    let mut total = automaton;
    for p in prompts {
        let (tokens, out) = (p.tokens as u64, p.max_tokens as u64);
        total = total
            .saturating_add(per_prompt_params)
            .saturating_add(tokens.saturating_mul(PROMPT_TOKEN_BYTES))
            // The engine's prompt logprobs, once per prompt, and their logits rows.
            .saturating_add(tokens.saturating_mul(prompt_width * 8))
            .saturating_add(if prompt_width > 0 {
                tokens.saturating_mul(4 * vocab_size as u64)
            } else {
                0
            })
            .saturating_add(
                (shape.prompt_logprobs_objects)
                    .saturating_mul(tokens)
                    .saturating_mul(prompt_width * PROMPT_LOGPROB_ENTRY_BYTES),
            )
            .saturating_add(seqs.saturating_mul(out).saturating_mul(TOKEN_BYTES))
            .saturating_add(
                seqs.saturating_mul(out)
                    .saturating_mul(logprob_width * shape.format.entry_bytes()),
            );
        if shape.echo {
            total = total.saturating_add(
                choices
                    .saturating_mul(tokens)
                    .saturating_mul(PROMPT_TOKEN_BYTES + prompt_width * LOGPROB_ENTRY_BYTES),
            );
        }
    }
    total
}

/// The server's memory bounds for requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// A request estimated above this gets 400 (`--max-request-memory`).
    pub per_request: u64,
    /// What requests in flight may hold together; a request that does not fit beside them
    /// gets 503.
    pub in_flight: u64,
}

impl MemoryLimits {
    /// Per request: an eighth of the memory left once the model and KV cache are loaded,
    /// at most 1 GiB; in flight: half of it. "Left" is the smallest of what the machine has
    /// available, the cgroup allows, and the address space `ulimit -v` leaves.
    pub(crate) fn from_headroom(headroom: u64) -> Self {
        MemoryLimits {
            per_request: (headroom / 8).clamp(16 << 20, 1 << 30),
            in_flight: (headroom / 2).max(64 << 20),
        }
    }

    /// With a per-request limit the user set: the pool holds at least four such requests.
    pub(crate) fn with_per_request(self, per_request: u64) -> Self {
        MemoryLimits {
            per_request,
            in_flight: self.in_flight.max(per_request.saturating_mul(4)),
        }
    }
}

/// The memory this process may still take, as far as Linux tells: available memory, the
/// cgroup's limit less its usage, and the address-space limit less the address space in use.
/// `None` where none can be read.
pub(crate) fn headroom() -> Option<u64> {
    let available = proc_kib_field("/proc/meminfo", "MemAvailable");
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|max| {
            let used = std::fs::read_to_string("/sys/fs/cgroup/memory.current")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            max.saturating_sub(used)
        });
    let address_space = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            let line = l.lines().find(|l| l.starts_with("Max address space"))?;
            line.split_whitespace().nth(3)?.parse::<u64>().ok()
        })
        .map(|limit| {
            let used = proc_kib_field("/proc/self/status", "VmSize").unwrap_or(0);
            limit.saturating_sub(used)
        });
    [available, cgroup, address_space]
        .into_iter()
        .flatten()
        .min()
}

/// The requests' shared pool.
#[derive(Debug)]
pub struct MemoryPool {
    limits: MemoryLimits,
    held: AtomicU64,
}

/// Memory a request holds from the pool until it is dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    pool: Arc<MemoryPool>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl MemoryPool {
    pub fn new(limits: MemoryLimits) -> Arc<Self> {
        Arc::new(MemoryPool {
            limits,
            held: AtomicU64::new(0),
        })
    }

    pub fn limits(&self) -> MemoryLimits {
        self.limits
    }

    /// Bytes reserved by requests in flight.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// Reserves `bytes` for a request (`what` describes it for the error), or says why not:
    /// 400 above the per-request limit, 503 while the requests in flight hold too much.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        bytes: u64,
        what: &str,
    ) -> Result<Reservation, ApiError> {
        if bytes > self.limits.per_request {
            return Err(ApiError::bad_request(
                format!(
                    "This request would hold up to {} ({what}), above the server's limit of {} \
                     per request (--max-request-memory). Ask for fewer prompts, a smaller n or \
                     max_tokens, fewer logprobs, or a shorter stop list.",
                    mib(bytes),
                    mib(self.limits.per_request)
                ),
                None,
            ));
        }
        let limit = self.limits.in_flight;
        let reserved = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= limit).then_some(held + bytes)
            });
        match reserved {
            Ok(_) => Ok(Reservation {
                pool: self.clone(),
                bytes,
            }),
            Err(held) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "The server is busy: requests in flight hold {} of the {} it allows them, \
                     and this one needs up to {}. Try again later.",
                    mib(held),
                    mib(limit),
                    mib(bytes)
                ),
                None,
            )),
        }
    }
}

/// Runs until the process ends: once a second, when the resident memory is more than
/// [`TRIM_GROWTH`] above the lowest it has been after a trim, hands the allocator's free
/// pages back to the system: at once when it has moved since the last trim, else after
/// [`TRIM_RETRY`], doubled each time a trim frees little (at most [`TRIM_RETRY_MAX`]).
/// glibc keeps freed heap pages otherwise, so one burst of large requests (or of large
/// refused ones: parsing them costs memory too) would leave the server at its peak. Freeing
/// does not move the resident size, so a trim during the burst, while the memory was still
/// in use, must be followed by one after it, though nothing has moved since.
pub(crate) async fn trim_freed_memory() {
    let Some(start) = resident_bytes() else {
        return;
    };
    let (mut floor, mut last) = (start, start);
    let mut retry = TRIM_RETRY;
    let mut since_trim = Duration::ZERO;
    loop {
        tokio::time::sleep(TRIM_POLL).await;
        since_trim += TRIM_POLL;
        let Some(now) = resident_bytes() else {
            return;
        };
        let moved = now.abs_diff(last) > TRIM_GROWTH / 4;
        if now <= floor + TRIM_GROWTH || !(moved || since_trim >= retry) {
            continue;
        }
        let _ = tokio::task::spawn_blocking(release_free_memory).await;
        let after = resident_bytes().unwrap_or(now);
        retry = if moved || now.saturating_sub(after) > TRIM_GROWTH / 4 {
            TRIM_RETRY
        } else {
            (retry * 2).min(TRIM_RETRY_MAX)
        };
        (last, since_trim) = (after, Duration::ZERO);
        floor = floor.min(after);
    }
}

/// Growth worth a trim: a trim walks the whole heap, so not for every few pages.
const TRIM_GROWTH: u64 = 16 << 20;
const TRIM_POLL: Duration = Duration::from_secs(1);
/// How soon a trim follows one that left the memory high, and the longest it waits when
/// trims keep freeing nothing (the memory is in use: each trim then only costs page faults).
const TRIM_RETRY: Duration = Duration::from_secs(3);
const TRIM_RETRY_MAX: Duration = Duration::from_secs(60);

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(tokens: usize, max_tokens: usize) -> PromptShape {
        PromptShape { tokens, max_tokens }
    }

    fn completions(echo: bool, prompt_logprobs_objects: u64) -> ResponseShape {
        ResponseShape {
            echo,
            prompt_logprobs_objects,
            format: LogprobFormat::Completions,
        }
    }

    fn chat(prompt_logprobs_objects: u64) -> ResponseShape {
        ResponseShape {
            echo: false,
            prompt_logprobs_objects,
            format: LogprobFormat::Chat,
        }
    }

    #[test]
    fn the_probes_requests_are_estimated_above_a_small_limit() {
        // n 256 x 20 logprobs x an echoed 800-token prompt: a 113 MB response.
        let p = SamplingParams {
            n: 256,
            logprobs: Some(20),
            prompt_logprobs: Some(20),
            ..SamplingParams::default()
        };
        let b = estimate(&p, &[shape(800, 1)], completions(true, 256), 49152);
        assert!(b > 1 << 30, "{b}");
        // 24 prompts sharing 1,024 stop strings of 4,096 bytes.
        let p = SamplingParams {
            stop: vec!["x".repeat(4096); 1024],
            ..SamplingParams::default()
        };
        let b = estimate(&p, &[shape(1, 16); 24], completions(false, 0), 49152);
        assert!(b > 24 * (4 << 20) + (60 << 20), "{b}");
        // All logprobs (-1) count the vocabulary's entries per token, no more, no overflow:
        // 16 tokens of a 49,152-token vocabulary are about 250 MB of response.
        let all = SamplingParams {
            logprobs: Some(crate::sampling_params::ALL_LOGPROBS),
            ..SamplingParams::default()
        };
        let b = estimate(&all, &[shape(8, 16)], completions(false, 0), 49152);
        assert!((200 << 20..300 << 20).contains(&b), "{b}");
        // Chat's entries cost more; prompt logprobs' objects count even without echo.
        let chat_b = estimate(&all, &[shape(8, 16)], chat(0), 49152);
        assert!(chat_b > 6 * b, "{chat_b} vs {b}");
        let prompt = SamplingParams {
            prompt_logprobs: Some(crate::sampling_params::ALL_LOGPROBS),
            ..SamplingParams::default()
        };
        let b = estimate(&prompt, &[shape(200, 1)], chat(1), 49152);
        assert!(b > 200 * 49152 * 1300, "{b}");
        // Echo's own prompt logprobs (completions-style) do not count the object it
        // does not write.
        let echoed = SamplingParams {
            n: 4,
            logprobs: Some(5),
            prompt_logprobs: Some(5),
            ..SamplingParams::default()
        };
        let with = estimate(&echoed, &[shape(1000, 16)], completions(true, 4), 49152);
        let without = estimate(&echoed, &[shape(1000, 16)], completions(true, 0), 49152);
        assert_eq!(with - without, 4 * 1000 * 6 * PROMPT_LOGPROB_ENTRY_BYTES);
        // An ordinary request is a few hundred kilobytes at most.
        let b = estimate(
            &SamplingParams::default(),
            &[shape(200, 256)],
            chat(0),
            49152,
        );
        assert!(b < 1 << 20, "{b}");
    }

    #[test]
    fn limits_refuse_with_400_and_the_pool_with_503() {
        let pool = MemoryPool::new(MemoryLimits {
            per_request: 100,
            in_flight: 150,
        });
        let e = pool.reserve(101, "1 prompt").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("--max-request-memory"), "{}", e.message);
        let a = pool.reserve(100, "a").unwrap();
        let e = pool.reserve(60, "b").unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        drop(a);
        assert_eq!(pool.held(), 0);
        let _b = pool.reserve(60, "b").unwrap();
        assert_eq!(pool.held(), 60);
    }

    #[test]
    fn headroom_is_read_and_limits_follow_it() {
        assert!(headroom().is_some_and(|h| h > 0));
        let l = MemoryLimits::from_headroom(1 << 30);
        assert_eq!(l.per_request, 128 << 20);
        assert_eq!(l.in_flight, 512 << 20);
        assert_eq!(MemoryLimits::from_headroom(64 << 30).per_request, 1 << 30);
        assert_eq!(l.with_per_request(256 << 20).in_flight, 1 << 30);
    }
}
