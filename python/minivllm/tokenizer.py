"""The model's tokenizer, with the methods of a Hugging Face tokenizer that scripts
written for vLLM use most (``LLM.get_tokenizer()``)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Union

from minivllm import _core

Conversation = Sequence[Dict[str, Any]]

# transformers' apply_chat_template options, at the defaults that leave the prompt as this
# template makes it; other values would change it, and are refused. Any other keyword is a
# template variable (enable_thinking, ...), as transformers passes it.
_HF_DEFAULTS: Dict[str, Any] = {
    "chat_template": None,
    "documents": None,
    "continue_final_message": False,
    "return_assistant_tokens_mask": False,
    "padding": False,
    "truncation": False,
    "max_length": None,
    "return_tensors": None,
    "tokenizer_kwargs": None,
}


def message_text(content: Any) -> str:
    """A message's content as text: a string, or OpenAI's list of parts (text parts are
    joined by newlines, as vLLM does)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, (list, tuple)):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text":
                texts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"message content of type {kind!r} is not supported (text only)")
        return "\n".join(texts)
    raise ValueError(f"message content must be a string or a list of parts, got {content!r}")


def conversation_json(conversation: Conversation) -> str:
    """The conversation as the chat template's JSON: each message's text, and the tool
    calls, ``tool_call_id`` and ``name`` that tool-using turns carry."""
    messages = []
    for m in conversation:
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"a chat message must be a dict with a 'role', got {m!r}")
        out: Dict[str, Any] = {"role": str(m["role"]), "content": message_text(m.get("content"))}
        for key in ("tool_calls", "tool_call_id", "name"):
            if m.get(key) is not None:
                out[key] = m[key]
        messages.append(out)
    try:
        return json.dumps(messages)
    except (TypeError, ValueError) as e:
        raise ValueError(f"chat messages must be JSON-serialisable: {e}") from None


def tools_json(tools: Optional[Sequence[Dict[str, Any]]]) -> Optional[str]:
    """OpenAI's tool objects for the chat template (``{"type": "function", "function":
    {...}}``), or ``None``."""
    if not tools:
        return None
    if not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools must be a list of dicts (OpenAI's tool objects)")
    try:
        return json.dumps(list(tools))
    except (TypeError, ValueError) as e:
        raise ValueError(f"tools must be JSON-serialisable: {e}") from None


def kwargs_json(kwargs: Optional[Dict[str, Any]]) -> Optional[str]:
    """Further chat template variables (``{"enable_thinking": True}``), or ``None``."""
    if not kwargs:
        return None
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("chat_template_kwargs must be a dict with string keys")
    try:
        return json.dumps(kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"chat_template_kwargs must be JSON-serialisable: {e}") from None


class Tokenizer:
    """The model's tokenizer (from its tokenizer.json, or the GGUF file's vocabulary)."""

    def __init__(self, inner: "_core.Tokenizer") -> None:
        self._inner = inner

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of ``text``; with ``add_special_tokens``, the model's BOS first."""
        return self._inner.encode(text, add_special_tokens)

    def tokenize(self, text: str, add_special_tokens: bool = False) -> List[str]:
        """The tokens of ``text`` as the vocabulary spells them (``"ĠParis"``), as a
        Hugging Face tokenizer's ``tokenize`` (no special tokens by default)."""
        ids = self.encode(text, add_special_tokens)
        return [t if t is not None else "" for t in self.convert_ids_to_tokens(ids)]

    def __call__(
        self, text: Union[str, Sequence[str]], add_special_tokens: bool = True
    ) -> Dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self.encode(text, add_special_tokens)}
        return {"input_ids": [self.encode(t, add_special_tokens) for t in text]}

    def batch_decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> List[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str]]) -> Union[Optional[int], List[Optional[int]]]:
        """Ids of vocabulary spellings (``"<|im_end|>"``), ``None`` for one not in it."""
        if isinstance(tokens, str):
            return self._inner.convert_tokens_to_ids([tokens])[0]
        return self._inner.convert_tokens_to_ids(list(tokens))

    def decode(self, token_ids: Union[int, Sequence[int]], skip_special_tokens: bool = False) -> str:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self._inner.decode(list(token_ids), skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]]) -> Union[Optional[str], List[Optional[str]]]:
        if isinstance(ids, int):
            return self._inner.convert_ids_to_tokens([ids])[0]
        return self._inner.convert_ids_to_tokens(list(ids))

    def apply_chat_template(
        self,
        conversation: Conversation,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> Union[str, List[int], Dict[str, List[int]]]:
        """The conversation through the model's chat template (transformers' defaults:
        token ids, no generation prompt). ``tools`` (OpenAI's tool objects) and any other
        keyword (``enable_thinking=True``, ...) go to the template, as in transformers;
        options minivllm does not implement (another ``chat_template``,
        ``continue_final_message``, ...) raise ``ValueError``."""
        tools = kwargs.pop("tools", None)
        given = [k for k, v in kwargs.items() if k in _HF_DEFAULTS and v != _HF_DEFAULTS[k]]
        if given:
            raise ValueError(f"apply_chat_template: not supported by minivllm: {sorted(given)}")
        variables = {k: v for k, v in kwargs.items() if k not in _HF_DEFAULTS}
        text = self._inner.render_chat(
            conversation_json(conversation),
            tools_json(tools),
            add_generation_prompt,
            kwargs_json(variables),
        )
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids} if return_dict else ids

    @property
    def chat_template(self) -> Optional[str]:
        return self._inner.chat_template

    @property
    def vocab_size(self) -> int:
        return self._inner.vocab_size

    def __len__(self) -> int:
        return self._inner.vocab_size

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._inner.eos_token_id

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._inner.bos_token_id

    @property
    def eos_token(self) -> Optional[str]:
        return self._inner.eos_token

    @property
    def bos_token(self) -> Optional[str]:
        return self._inner.bos_token
