//! `POST /v1/embeddings`: each input's final hidden states pooled (`--pooler-config`: the
//! last token's or their mean, normalised) by a prefill-only pass through the engine, in the
//! same batches as generation.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::Response;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::protocol::{ApiError, PromptField};
use super::request_memory::{LogprobFormat, ResponseShape};
use super::server_state::{AppState, RequestId, Shared};
use super::serving_completion::prompts;
use super::serving_engine::{
    admit, check_model, check_request_width, json_response, merge, now, off_async, parse, submit,
    Held, Prompt,
};
use crate::engine::input_processor::CheckedParams;
use crate::sampling_params::{RequestOutputKind, SamplingParams};

/// OpenAI's embeddings request, with vLLM's `normalize` and `priority`.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: PromptField,
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    pub dimensions: Option<usize>,
    pub normalize: Option<bool>,
    #[serde(default)]
    pub priority: i32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    /// The vector's little-endian f32 bytes in base64 (what OpenAI's Python client asks
    /// for by default, and decodes with numpy).
    Base64,
}

pub async fn embeddings(
    State(s): State<Shared>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, prompts, params, _held) = off_async(&s, move |s| prepare(s, body)).await?;
    let streams = submit(&s, &rid, "embd", &prompts, params).await?;
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; prompts.len()];
    let mut rx = merge(streams);
    while let Some((i, out)) = rx.recv().await {
        if let Some(v) = out.pooled {
            vectors[i] = Some(v);
        }
    }
    let format = req.encoding_format;
    let model = s.config.served_model_name.clone();
    let body = off_async(&s, move |_| {
        let data: Result<Vec<Value>, ApiError> = (vectors.into_iter().enumerate())
            .map(|(i, v)| {
                let v =
                    v.ok_or_else(|| ApiError::internal("the engine ended the request early"))?;
                Ok(json!({"object": "embedding", "index": i, "embedding": encode(&v, format)}))
            })
            .collect();
        let tokens: usize = prompts.iter().map(|p| p.ids.len()).sum();
        Ok::<_, ApiError>(json!({
            "id": format!("embd-{}", rid.0), "object": "list", "created": now(),
            "model": model, "data": data?,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
    })
    .await?;
    Ok(json_response(&body))
}

fn encode(v: &[f32], format: EncodingFormat) -> Value {
    match format {
        EncodingFormat::Float => json!(v),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            json!(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

type Prepared = (EmbeddingRequest, Vec<Prompt>, Vec<CheckedParams>, Held);

fn prepare(s: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Prepared, ApiError> {
    let req: EmbeddingRequest = parse(body)?;
    check_model(s, req.model.as_deref())?;
    if req.dimensions.is_some() {
        return Err(ApiError::bad_request(
            "dimensions is not supported: this model's embeddings have one size (its hidden \
             size), not matryoshka ones",
            Some("dimensions"),
        ));
    }
    let mut pooling = s.config.pooler;
    if let Some(normalize) = req.normalize {
        pooling.normalize = normalize;
    }
    let base = SamplingParams {
        pooling: Some(pooling),
        max_tokens: Some(1),
        output_kind: RequestOutputKind::FinalOnly,
        ..SamplingParams::default()
    };
    let checked = s.engine.check(base, req.priority)?;
    check_request_width(s, checked.params(), req.input.len())?;
    let prompts = prompts(s, req.input.clone(), "input")?;
    let response = ResponseShape {
        echo: false,
        prompt_logprobs_objects: 0,
        format: LogprobFormat::Completions,
    };
    let (params, held) = admit(s, checked, &prompts, response)?;
    Ok((req, prompts, params, held))
}
