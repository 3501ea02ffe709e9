//! A response's token counts, counted from the engine's outputs, which every route writes
//! in its own form (OpenAI's `usage`, Anthropic's, the Responses API's).

use serde_json::{json, Value};

use crate::outputs::RequestOutput;

/// A response's token counts: OpenAI's `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt: usize,
    pub completion: usize,
    /// Prompt tokens the prefix cache held.
    pub cached: usize,
}

impl Usage {
    pub fn of(out: &RequestOutput) -> Self {
        let mut u = Usage::default();
        u.add(out);
        u
    }

    /// Counts one more request's prompt, cached prompt and generated tokens: its whole
    /// output is its first and only delta.
    pub fn add(&mut self, out: &RequestOutput) {
        self.add_delta(out, true);
    }

    /// Counts a `DELTA` output of a request: its new tokens, and with its `first` output
    /// its prompt and what of it the prefix cache held (known once its prefill is done,
    /// which its first output follows), so a request the engine ends early still counts it.
    pub(crate) fn add_delta(&mut self, out: &RequestOutput, first: bool) {
        self.completion += out.num_generated_tokens();
        if first {
            self.prompt += out.prompt_token_ids.len();
            self.cached += out.num_cached_tokens;
        }
    }

    /// With `details` (`--enable-prompt-tokens-details`, as vLLM), also
    /// `prompt_tokens_details.cached_tokens`.
    pub fn json(&self, details: bool) -> Value {
        let mut v = json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
        });
        if details {
            v["prompt_tokens_details"] = json!({"cached_tokens": self.cached});
        }
        v
    }
}
