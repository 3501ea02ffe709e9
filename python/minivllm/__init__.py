"""minivllm: an LLM inference engine in the line of vLLM, written in Rust.

A script written for vLLM runs on minivllm by changing its import line::

    from minivllm import LLM, SamplingParams

    llm = LLM(model="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    outputs = llm.generate(["The capital of France is"], SamplingParams(temperature=0))
    print(outputs[0].outputs[0].text)

The engine logs through Python's :mod:`logging`, under the logger ``"minivllm"``.
"""

from minivllm._core import __version__
from minivllm.engine.arg_utils import EngineArgs
from minivllm.llm import LLM
from minivllm.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from minivllm.pooling_params import PoolingParams
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from minivllm.tokenizer import Tokenizer

__all__ = [
    "LLM",
    "EngineArgs",
    "SamplingParams",
    "RequestOutputKind",
    "RequestOutput",
    "RequestMetrics",
    "CompletionOutput",
    "Logprob",
    "PoolingParams",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "PoolingOutput",
    "PoolingRequestOutput",
    "Tokenizer",
    "__version__",
]
