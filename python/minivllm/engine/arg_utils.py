"""vLLM's ``EngineArgs``: the ``LLM`` arguments as a dataclass, with ``add_cli_args`` and
``from_cli_args`` for vLLM's argparse-based example scripts::

    parser = FlexibleArgumentParser()
    parser = EngineArgs.add_cli_args(parser)
    args = parser.parse_args()
    llm = LLM(**dataclasses.asdict(EngineArgs.from_cli_args(args)))
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union


def _json_dict(text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


@dataclass
class EngineArgs:
    """What ``LLM(...)`` takes (see ``minivllm.LLM``), with vLLM's names and defaults where
    vLLM has them."""

    model: str = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer: Optional[str] = None
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    quantization: Optional[str] = None
    seed: Optional[int] = 0
    swap_space: float = 0
    kv_cache_memory_bytes: Optional[int] = None
    max_model_len: Optional[int] = None
    max_num_seqs: int = 256
    max_num_batched_tokens: Optional[int] = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    kv_cache_dtype: str = "auto"
    scheduling_policy: str = "fcfs"
    reasoning_parser: Optional[str] = None
    speculative_config: Optional[Dict[str, Any]] = None
    max_logprobs: int = 20
    kv_events_config: Optional[Dict[str, Any]] = None
    kv_transfer_config: Optional[Dict[str, Any]] = None
    # vLLM's GPU-side settings: accepted, and ignored by LLM (with a warning if changed).
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    trust_remote_code: bool = False

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Adds ``--model``, ``--max-model-len``, ... (vLLM's flag names) to ``parser``."""
        group = parser.add_argument_group("EngineArgs")
        for f in dataclasses.fields(EngineArgs):
            flag = "--" + f.name.replace("_", "-")
            default = f.default
            if f.type in ("bool",) or isinstance(default, bool):
                group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            elif f.name in ("speculative_config", "kv_events_config", "kv_transfer_config"):
                group.add_argument(flag, type=_json_dict, default=default,
                                   help=f"JSON, as vLLM's {flag}")
            else:
                kind = {int: int, float: float}.get(type(default), str)
                if f.name in ("max_model_len", "max_num_batched_tokens",
                              "kv_cache_memory_bytes", "seed"):
                    kind = int
                group.add_argument(flag, type=kind, default=default)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        """The fields ``add_cli_args`` parsed (other attributes of ``args`` are ignored)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)})


AsyncEngineArgs = EngineArgs

__all__ = ["EngineArgs", "AsyncEngineArgs"]
