"""vLLM's ``SamplingParams``: the same fields, defaults and validation messages."""

from __future__ import annotations

import copy
import enum
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from minivllm import _core


class RequestOutputKind(enum.Enum):
    """What each output of a request carries. ``LLM.generate`` returns final outputs,
    whatever this says (as vLLM's ``LLM`` does)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


# vLLM's fields that minivllm does not implement: accepted at their defaults only, so a
# script that relies on one fails loudly rather than running without it.
_UNSUPPORTED_DEFAULTS = {
    "detokenize": True,
    "logits_processors": None,
    "truncate_prompt_tokens": None,
    "allowed_token_ids": None,
    "bad_words": None,
}

# Counts that vLLM checks for negative values before anything else, with its messages.
_NON_NEGATIVE = {
    "min_tokens": "min_tokens must be greater than or equal to 0, got {}.",
    "logprobs": "logprobs must be non-negative or -1, got {}.",
    "prompt_logprobs": "prompt_logprobs must be non-negative or -1, got {}.",
}
# Where -1 is allowed: the whole vocabulary (the engine's limit, `max_logprobs`, decides).
_MINUS_ONE_ALLOWED = ("logprobs", "prompt_logprobs")

# What vLLM says of a NaN or infinite value (JSON, the engine's input, has neither).
_NOT_FINITE = {
    "presence_penalty": "presence_penalty must be in [-2, 2], got {}.",
    "frequency_penalty": "frequency_penalty must be in [-2, 2], got {}.",
    "repetition_penalty": "repetition_penalty must be a finite number, got {}.",
    "temperature": "temperature must be a finite number, got {}.",
    "top_p": "top_p must be in (0, 1], got {}.",
    "min_p": "min_p must be in [0, 1], got {}.",
}


# Each field's type, checked before the engine reads the fields, so a wrong one is named
# (`seed must be an int, got str ('x')`) rather than met by the engine's JSON parser.
_INTS = ("n", "best_of", "top_k", "seed", "max_tokens", "min_tokens", "logprobs",
         "prompt_logprobs")
_FLOATS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
           "top_p", "min_p")
_BOOLS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
          "include_stop_str_in_output", "detokenize")
_OPTIONAL = ("best_of", "seed", "max_tokens", "logprobs", "prompt_logprobs")


def _type_error(name: str, want: str, value: Any) -> TypeError:
    return TypeError(f"{name} must be {want}, got {type(value).__name__} ({value!r})")


def _check_types(p: "SamplingParams") -> None:
    for name in _INTS:
        v = getattr(p, name)
        if v is None and name in _OPTIONAL:
            continue
        if not isinstance(v, int) or isinstance(v, bool):
            raise _type_error(name, "an int", v)
    for name in _FLOATS:
        v = getattr(p, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise _type_error(name, "a number", v)
    for name in _BOOLS:
        v = getattr(p, name)
        if not isinstance(v, bool):
            raise _type_error(name, "a bool", v)
    stop = p.stop
    if not isinstance(stop, (str, list, tuple)) or (
            not isinstance(stop, str) and not all(isinstance(s, str) for s in stop)):
        raise _type_error("stop", "a string or a list of strings", stop)
    ids = p.stop_token_ids
    if not isinstance(ids, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise _type_error("stop_token_ids", "a list of ints", ids)
    bias = p.logit_bias
    if bias is not None and (not isinstance(bias, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in bias.values())):
        raise _type_error("logit_bias", "a dict of token id to a number", bias)


@dataclass
class StructuredOutputsParams:
    """vLLM's ``StructuredOutputsParams``: the one constraint every completion follows.

    Args:
        json: A JSON schema: a dict, its JSON text, or a pydantic model class (its
            ``model_json_schema()``).
        regex: A regular expression the whole completion matches.
        choice: The completion is one of these strings.
        grammar: A context-free grammar in llguidance's Lark dialect.
        json_object: Any JSON object.
        disable_any_whitespace: JSON without whitespace between its tokens.
        structural_tag: vLLM's structural tag as JSON text: free text, with JSON of a
            structure's schema after each trigger (docs/structured-output.md).

    vLLM's other options (``disable_fallback``, ``disable_additional_properties``,
    ``whitespace_pattern``) are accepted and have no effect.
    """

    json: Optional[Union[str, Dict[str, Any], Any]] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Optional[str] = None
    structural_tag: Optional[str] = None

    def _to_dict(self) -> Dict[str, Any]:
        schema = self.json
        if hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        fields = {
            "json": schema,
            "regex": self.regex,
            "choice": None if self.choice is None else list(self.choice),
            "grammar": self.grammar,
            "json_object": self.json_object,
            "disable_any_whitespace": self.disable_any_whitespace,
            "structural_tag": self.structural_tag,
        }
        return {k: v for k, v in fields.items() if v is not None}


# vLLM's earlier name for the same parameters.
GuidedDecodingParams = StructuredOutputsParams


@dataclass
class SamplingParams:
    """How to sample the completions of one prompt (vLLM's ``SamplingParams``).

    Checked when made (and again when a request is submitted): an invalid value raises
    ``ValueError`` with vLLM's message.

    Args:
        n: Completions to return.
        best_of: Completions to generate, of which the ``n`` with the highest cumulative
            log-probability are returned (default: ``n``).
        presence_penalty: Subtracted once from the logit of every token already generated.
        frequency_penalty: Subtracted from every token's logit once per time it was generated.
        repetition_penalty: Divides positive (multiplies negative) logits of tokens in the
            prompt or the output; 1 is off.
        temperature: 0 is greedy.
        top_p: Sample from the smallest set of tokens whose probability reaches ``top_p``.
        top_k: Sample from the ``top_k`` most likely tokens; 0 (or -1) is off.
        min_p: Drop tokens less likely than ``min_p`` times the most likely one.
        seed: Makes the request's samples reproducible, whatever shares its batches.
        stop: Strings that end a completion (not included in the text unless
            ``include_stop_str_in_output``).
        stop_token_ids: Tokens that end a completion (included in its token ids).
        ignore_eos: Keep generating past the end-of-sequence token.
        max_tokens: Most tokens to generate; ``None``: up to the model's context length.
        min_tokens: EOS and stop tokens are banned until this many tokens are generated.
        logprobs: Log-probabilities of this many most likely tokens per generated token,
            plus the chosen one; -1 for the whole vocabulary (the ``LLM`` must allow it:
            ``max_logprobs=-1``).
        prompt_logprobs: The same for every prompt token.
        skip_special_tokens: Leave special tokens out of the text.
        spaces_between_special_tokens: Put spaces between special tokens in the text.
        include_stop_str_in_output: Keep the stop string that ended a completion.
        output_kind: Kept for vLLM's scripts; ``LLM.generate`` returns final outputs.
        logit_bias: Added to these tokens' logits (token id to bias in [-100, 100]).
        structured_outputs: A ``StructuredOutputsParams``: JSON schema, regex, choice or
            grammar every completion follows (``guided_decoding``, vLLM's earlier name,
            is taken too).
    """

    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    bad_words: Optional[List[str]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logits_processors: Optional[Any] = None
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Optional[int] = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    guided_decoding: Optional[Any] = None
    logit_bias: Optional[Dict[int, float]] = None
    allowed_token_ids: Optional[List[int]] = None
    extra_args: Optional[Dict[str, Any]] = None
    structured_outputs: Optional[StructuredOutputsParams] = None

    def __post_init__(self) -> None:
        # vLLM's normalisations.
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.seed == -1:
            self.seed = None
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        if isinstance(self.stop, tuple):
            self.stop = list(self.stop)
        self.validate()

    def validate(self) -> None:
        """Checks every field as vLLM does; raises ``ValueError`` naming the first fault."""
        self._checked_json()

    def _checked_json(self) -> str:
        """The fields as the engine takes them (JSON), once checked."""
        _check_types(self)
        for name, default in _UNSUPPORTED_DEFAULTS.items():
            value = getattr(self, name)
            if value != default and not (name in ("bad_words", "allowed_token_ids") and not value):
                raise ValueError(f"{name} is not supported by minivllm (docs/python.md)")
        for name, message in _NON_NEGATIVE.items():
            value = getattr(self, name)
            if isinstance(value, int) and value < 0 and not (value == -1 and name in _MINUS_ONE_ALLOWED):
                raise ValueError(message.format(value))
        for name, message in _NOT_FINITE.items():
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(message.format(value))
        if isinstance(self.n, int) and self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if isinstance(self.max_tokens, int) and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        fields = self._to_json()
        _core.check_sampling_params(fields)
        return fields

    def _to_json(self) -> str:
        """The fields the engine reads, as JSON with its names."""
        stop = self.stop
        if isinstance(stop, str):
            stop = [stop]
        top_k = self.top_k
        if top_k == -1:  # vLLM's older "off"
            top_k = 0
        fields = {
            "n": self.n,
            "best_of": self.best_of,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "stop": list(stop or []),
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": self.ignore_eos,
            "max_tokens": self.max_tokens,
            "min_tokens": self.min_tokens,
            "logprobs": self.logprobs,
            "prompt_logprobs": self.prompt_logprobs,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "logit_bias": {str(int(k)): v for k, v in (self.logit_bias or {}).items()},
        }
        extra = dict(self.extra_args or {})
        if "kv_transfer_params" in extra:
            fields["kv_transfer_params"] = extra.pop("kv_transfer_params")
        if extra:
            raise ValueError(
                f"extra_args {sorted(extra)} are not supported by minivllm "
                "(only kv_transfer_params)")
        if self.structured_outputs is not None and self.guided_decoding is not None:
            raise ValueError("structured_outputs and guided_decoding are both set: use one")
        constraint = (self.structured_outputs if self.structured_outputs is not None
                      else self.guided_decoding)
        if constraint is not None:
            if isinstance(constraint, dict):
                try:
                    constraint = StructuredOutputsParams(**constraint)
                except TypeError as e:
                    raise ValueError(f"invalid structured_outputs: {e}") from None
            if not isinstance(constraint, StructuredOutputsParams):
                raise ValueError(
                    "structured_outputs must be a StructuredOutputsParams, got "
                    f"{type(constraint).__name__}")
            fields["structured_outputs"] = constraint._to_dict()
        try:
            return json.dumps(fields, allow_nan=True)
        except (TypeError, ValueError) as e:
            raise ValueError(f"invalid sampling parameters: {e}") from None

    def clone(self) -> "SamplingParams":
        """A deep copy (vLLM's ``clone``)."""
        return copy.deepcopy(self)

    def _with_seed(self, seed: int) -> "SamplingParams":
        """A copy with this seed, unchecked: the caller checks it (``_checked_json``)."""
        seeded = copy.copy(self)
        seeded.seed = seed
        return seeded
