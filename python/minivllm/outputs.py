"""vLLM's output classes: ``RequestOutput``, ``CompletionOutput`` and ``Logprob``; for
embeddings ``EmbeddingRequestOutput`` and ``PoolingRequestOutput``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union


@dataclass
class Logprob:
    """The log-probability of one token at one position.

    Attributes:
        logprob: Its log-probability under the model's raw logits (before temperature and
            penalties: vLLM's default).
        rank: Its rank (1 is the most likely): the top ``k`` by their place, the chosen token
            among them at its place, before tokens as likely; a chosen token outside them
            counts the tokens at least as likely, as vLLM's.
        decoded_token: The token's text.
    """

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


SampleLogprobs = List[Dict[int, Logprob]]
PromptLogprobs = List[Optional[Dict[int, Logprob]]]


@dataclass
class CompletionOutput:
    """One completion of a request.

    Attributes:
        index: Its index among the request's completions.
        text: The generated text.
        token_ids: The generated tokens.
        cumulative_logprob: The sum of the generated tokens' log-probabilities (``None``
            unless the request asked for ``logprobs``, as vLLM).
        logprobs: Per generated token, the top log-probabilities (the chosen token
            first), when the request asked for ``logprobs``.
        finish_reason: ``"stop"`` (EOS, a stop string or token), ``"length"``,
            ``"abort"``, or ``"error"`` (its structured-output grammar broke); ``None``
            while it runs.
        stop_reason: The stop string or stop token id that ended it, if one did.
    """

    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    lora_request: Optional[object] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """vLLM's ``RequestMetrics``, in seconds since the Unix epoch (``time.time()``).

    ``first_scheduled_time`` is when the scheduler first gave the request a step (before
    that step's forward pass); ``time_in_queue`` is that less ``arrival_time``.
    """

    arrival_time: float
    last_token_time: Optional[float]
    first_scheduled_time: Optional[float]
    first_token_time: Optional[float]
    time_in_queue: Optional[float]
    finished_time: Optional[float] = None
    scheduler_time: Optional[float] = None
    model_forward_time: Optional[float] = None
    model_execute_time: Optional[float] = None


@dataclass
class RequestOutput:
    """The result of one prompt.

    Attributes:
        request_id: The request's id.
        prompt: The prompt's text (``None`` when it came as token ids).
        prompt_token_ids: The prompt's tokens.
        prompt_logprobs: Per prompt token, its top log-probabilities (``None`` for the
            first), when the request asked for ``prompt_logprobs``.
        outputs: The completions, ``n`` of them.
        finished: Whether the request is done.
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Optional[object] = None
    lora_request: Optional[object] = None
    encoder_prompt: Optional[str] = None
    encoder_prompt_token_ids: Optional[List[int]] = None
    num_cached_tokens: Optional[int] = None
    # A prefill kept for another engine: where its KV waits (vLLM's field).
    kv_transfer_params: Optional[Dict[str, Any]] = None


@dataclass
class EmbeddingOutput:
    """One prompt's embedding: its pooled final hidden state."""

    embedding: List[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class PoolingOutput:
    """One prompt's pooled vector (``LLM.encode``; a list where vLLM has a tensor)."""

    data: List[float]


@dataclass
class EmbeddingRequestOutput:
    """What ``LLM.embed`` returns per prompt (vLLM's)."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: List[int]
    finished: bool


@dataclass
class PoolingRequestOutput:
    """What ``LLM.encode`` returns per prompt (vLLM's)."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: List[int]
    finished: bool
