//! The model's tokenizer for Python (`LLM.get_tokenizer()`), with the methods of a Hugging
//! Face tokenizer that scripts written for vLLM call most.

use std::sync::Arc;

use pyo3::prelude::*;

use minivllm::engine::tokenizer::Tokenizer as EngineTokenizer;
use minivllm::entrypoints::openai::protocol::{chat_messages, ChatMessageIn};

use crate::value_error;

#[pyclass(frozen, module = "minivllm._core")]
pub struct Tokenizer {
    inner: Arc<EngineTokenizer>,
}

impl Tokenizer {
    pub fn new(inner: Arc<EngineTokenizer>) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl Tokenizer {
    /// Token ids of `text`, with the model's BOS (and EOS) when `add_special_tokens`.
    #[pyo3(signature = (text, add_special_tokens = true))]
    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        py.detach(|| self.inner.encode(text, add_special_tokens))
            .map_err(value_error)
    }

    #[pyo3(signature = (token_ids, skip_special_tokens = false))]
    fn decode(&self, token_ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        self.inner
            .decode(&token_ids, skip_special_tokens)
            .map_err(value_error)
    }

    /// The tokens' spellings in the vocabulary (`None` for an id outside it).
    fn convert_ids_to_tokens(&self, token_ids: Vec<u32>) -> Vec<Option<String>> {
        token_ids
            .into_iter()
            .map(|id| self.inner.id_to_token(id))
            .collect()
    }

    /// The tokens' ids (`None` for a spelling outside the vocabulary).
    fn convert_tokens_to_ids(&self, tokens: Vec<String>) -> Vec<Option<u32>> {
        tokens.iter().map(|t| self.inner.token_to_id(t)).collect()
    }

    /// `messages`: the conversation as JSON (OpenAI's message objects, tool calls and tool
    /// turns included); `tools`: JSON list of tool objects for the template, or `None`;
    /// `kwargs`: a JSON object of further template variables, or `None`; `template`: a
    /// template to use instead of the model's. Returns the prompt text.
    #[pyo3(signature = (messages, tools, add_generation_prompt, kwargs=None, template=None))]
    fn render_chat(
        &self,
        messages: &str,
        tools: Option<&str>,
        add_generation_prompt: bool,
        kwargs: Option<&str>,
        template: Option<&str>,
    ) -> PyResult<String> {
        let messages: Vec<ChatMessageIn> = serde_json::from_str(messages)
            .map_err(|e| value_error(format!("chat messages: {e}")))?;
        let messages = chat_messages(&messages).map_err(|e| value_error(e.message))?;
        let tools: Vec<serde_json::Value> = match tools {
            Some(t) => serde_json::from_str(t).map_err(|e| value_error(format!("tools: {e}")))?,
            None => Vec::new(),
        };
        let kwargs: serde_json::Map<String, serde_json::Value> = match kwargs {
            Some(k) => serde_json::from_str(k)
                .map_err(|e| value_error(format!("chat template kwargs: {e}")))?,
            None => serde_json::Map::new(),
        };
        match template {
            Some(source) => self.inner.apply_given_chat_template(
                source,
                &messages,
                &tools,
                add_generation_prompt,
                &kwargs,
            ),
            None => self.inner.apply_chat_template_with_tools(
                &messages,
                &tools,
                add_generation_prompt,
                &kwargs,
            ),
        }
        .map_err(value_error)
    }

    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.inner.chat_template().map(str::to_owned)
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    #[getter]
    fn eos_token_id(&self) -> Option<u32> {
        self.inner.eos_token_id()
    }

    #[getter]
    fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos_token_id()
    }

    #[getter]
    fn eos_token(&self) -> Option<String> {
        self.inner.eos_token().map(str::to_owned)
    }

    #[getter]
    fn bos_token(&self) -> Option<String> {
        self.inner.bos_token().map(str::to_owned)
    }
}
