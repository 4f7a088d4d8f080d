"""Type stubs of promptcache (docs/python.md)."""
import os
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

__version__: str

_PathLike = Union[str, "os.PathLike[str]"]
_ModuleSpec = Union[str, Tuple[str], Tuple[str, Mapping[str, Any]],
                    Tuple[str, Mapping[str, Any], Sequence["_ModuleSpec"]]]

class Error(Exception):
    """Every error promptcache reports; str(e) is the CLI's message."""

    kind: str
    message: str
    file: Optional[str]
    line: Optional[int]
    column: Optional[int]
    element: Optional[str]

class SchemaError(Error, ValueError):
    """A PML problem (schema or prompt), with file/line/column/element."""

class ModelError(Error):
    """A model folder or file that cannot be used."""

class Prompt:
    """A prompt built in code instead of PML text."""

    def __init__(self, schema: str, modules: Optional[Sequence[_ModuleSpec]] = None,
                 text: str = "") -> None: ...
    @property
    def schema(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def modules(self) -> List[str]: ...

_PromptLike = Union[str, Prompt]

class Generation:
    """What Engine.generate gave for one prompt."""

    @property
    def text(self) -> str: ...
    @property
    def token_ids(self) -> List[int]: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def fresh_tokens(self) -> int: ...
    @property
    def ttft_ms(self) -> float: ...
    @property
    def assembly_ms(self) -> float: ...
    @property
    def prefill_ms(self) -> float: ...
    @property
    def decode_ms(self) -> float: ...
    @property
    def stop_reason(self) -> str: ...

class Score:
    """What Engine.score gave: one entry per choice."""

    @property
    def logprobs(self) -> List[float]: ...
    @property
    def tokens(self) -> List[List[int]]: ...
    @property
    def logprob_per_token(self) -> List[List[float]]: ...
    @property
    def pred(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...

class EvalRun(Iterator[Dict[str, Any]]):
    """The iterator Engine.eval returns: each answered row's result as a dict."""

    errors: List[str]
    @property
    def summary(self) -> Dict[str, Any]: ...
    def __iter__(self) -> "EvalRun": ...
    def __next__(self) -> Dict[str, Any]: ...

class Engine:
    """A model with its loaded schemas."""

    model: str
    def __init__(self, model: _PathLike, device: str = "cpu", weights: Optional[str] = None,
                 threads: int = 0, cache_dir: Optional[_PathLike] = None,
                 redis: Optional[str] = None, *, dtype: Optional[str] = None,
                 kv_dtype: Optional[str] = None, template: Optional[str] = None,
                 encoding: str = "scaffold", cache_secret: Optional[str] = None) -> None: ...
    def add_schema(self, schema: _PathLike) -> str: ...
    def generate(self, prompt: _PromptLike, max_new_tokens: int = 32, temperature: float = 0.0,
                 stop: Union[None, str, Sequence[str]] = None, no_cache: bool = False, *,
                 top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 seed: int = 0, ignore_eos: bool = False) -> Generation: ...
    def generate_batch(self, prompts: Sequence[_PromptLike], max_new_tokens: int = 32,
                       temperature: float = 0.0, stop: Union[None, str, Sequence[str]] = None,
                       no_cache: bool = False, *, top_k: int = 0, top_p: float = 1.0,
                       repetition_penalty: float = 1.0, seed: int = 0,
                       ignore_eos: bool = False) -> List[Generation]: ...
    def score(self, prompt: _PromptLike, choices: Sequence[str],
              no_cache: bool = False) -> Score: ...
    def next_token_logits(self, prompt: _PromptLike, no_cache: bool = False) -> torch.Tensor: ...
    def tokenize(self, text: str, bos: bool = False) -> List[int]: ...
    def detokenize(self, ids: Iterable[int]) -> str: ...
    def layout(self, schema: str) -> List[Dict[str, Any]]: ...
    def eval(self, data: Union[_PathLike, Iterable[Mapping[str, Any]]], schema: _PathLike,
             out: Optional[_PathLike] = None, *, no_cache: bool = False, batch: int = 8,
             limit: int = 0, strict: bool = False, max_new_tokens: int = 32,
             temperature: float = 0.0, stop: Union[None, str, Sequence[str]] = None,
             top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int = 0,
             progress: bool = True) -> EvalRun: ...
