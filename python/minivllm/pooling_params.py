"""vLLM's ``PoolingParams``: how ``LLM.embed`` and ``LLM.encode`` pool a prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

_POOLING_TYPES = ("LAST", "MEAN")


@dataclass
class PoolingParams:
    """Per-call pooling settings.

    Attributes:
        normalize: Scale each vector to unit length (``None``: the ``LLM``'s
            ``pooler_config``, whose default is ``True``).
        dimensions: Matryoshka truncation; refused (this model's vectors have one size).
        truncate_prompt_tokens: Refused: prompts longer than the context are errors.
    """

    normalize: Optional[bool] = None
    dimensions: Optional[int] = None
    truncate_prompt_tokens: Optional[int] = None

    def _json(self, pooler: Dict[str, Any]) -> str:
        import json

        if self.dimensions is not None:
            raise ValueError("dimensions is not supported: this model's embeddings have one size")
        if self.truncate_prompt_tokens is not None:
            raise ValueError("truncate_prompt_tokens is not supported by minivllm")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be a bool, got {type(self.normalize).__name__}")
        merged = dict(pooler)
        if self.normalize is not None:
            merged["normalize"] = self.normalize
        return json.dumps(merged)


def pooler_config(value: Any) -> Dict[str, Any]:
    """vLLM's ``pooler_config`` (a ``PoolerConfig``-like object or a dict) as the engine's
    JSON fields, checked."""
    if value is None:
        return {"pooling_type": "LAST", "normalize": True}
    get = value.get if isinstance(value, dict) else (lambda k, d=None: getattr(value, k, d))
    pooling_type = get("pooling_type", None) or "LAST"
    if str(pooling_type).upper() not in _POOLING_TYPES:
        raise ValueError(
            f"pooler_config: pooling_type {pooling_type!r} is not supported (LAST or MEAN)"
        )
    normalize = get("normalize", None)
    return {
        "pooling_type": str(pooling_type).upper(),
        "normalize": True if normalize is None else bool(normalize),
    }
