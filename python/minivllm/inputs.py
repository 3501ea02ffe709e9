"""vLLM's prompt types (``vllm.inputs``): what ``LLM.generate``, ``LLM.embed`` and
``LLM.encode`` take besides plain strings and token-id lists."""

from __future__ import annotations

from typing import Any, Dict, List, Union

try:
    from typing import NotRequired, TypedDict
except ImportError:  # Python < 3.11
    from typing_extensions import NotRequired, TypedDict  # type: ignore[assignment]


class TextPrompt(TypedDict):
    """A prompt as text, tokenised by the model's tokenizer (its BOS added)."""

    prompt: str
    multi_modal_data: NotRequired[Any]
    mm_processor_kwargs: NotRequired[Dict[str, Any]]
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """A prompt as token ids, fed as they are."""

    prompt_token_ids: List[int]
    prompt: NotRequired[str]
    multi_modal_data: NotRequired[Any]
    mm_processor_kwargs: NotRequired[Dict[str, Any]]
    cache_salt: NotRequired[str]


SingletonPrompt = Union[str, TextPrompt, TokensPrompt]
PromptType = SingletonPrompt

__all__ = ["TextPrompt", "TokensPrompt", "SingletonPrompt", "PromptType"]
