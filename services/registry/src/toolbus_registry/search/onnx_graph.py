"""The encoder's transformer layers as an ONNX model for onnxruntime, written from the int8 weights
loaded from the bundled model: each weight matrix an 8-bit `MatMulNBits` with the same per-column
scales, its activations quantized per row block (a text's vector does not depend on the texts
batched with it). One call runs every layer, outside the GIL.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

BLOCK = 32
"""Rows of a weight column sharing one scale block (the column's scale is repeated per block),
and the run of an activation row quantized together: at 32 the labelled sets rank as with the
float activations of the numpy encoder (at 128, 4 fewer of 178 Twilio tasks first)."""
ACCURACY_LEVEL = 4
"""`MatMulNBits` computes in int8 (activations quantized per row block): AVX-512 VNNI / AVX2."""
OPSET = 17
IR_VERSION = 8
"""The ONNX file format version of opset 17."""

# ONNX's protobuf messages, written field by field (onnx/onnx.proto): the `onnx` package would
# cost 0.6 s of import and ~21 MiB of RSS to write these few messages (docs/design.md).
_FLOAT, _UINT8, _INT8, _INT64 = 1, 2, 3, 7
"""TensorProto.DataType values."""
_DTYPES = {np.dtype(np.float32): _FLOAT, np.dtype(np.uint8): _UINT8, np.dtype(np.int8): _INT8}
_DTYPES[np.dtype(np.int64)] = _INT64
_ATTR_FLOAT, _ATTR_INT, _ATTR_INTS = 1, 2, 7
"""AttributeProto.AttributeType values."""


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64 as its two's complement
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, value: bytes | str | int | float) -> bytes:
    """One protobuf field: an int as a varint, a float as fixed 32 bits, else length-delimited."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    if isinstance(value, float):
        return _varint(number << 3 | 5) + struct.pack("<f", value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _sized(number: int, parts: list[bytes]) -> list[bytes]:
    """A length-delimited field of `parts`, left unjoined: the model's 11 MiB of weights are
    copied once, when the whole model is joined."""
    return [_varint(number << 3 | 2) + _varint(sum(len(part) for part in parts)), *parts]


def _tensor(name: str, array: npt.NDArray[np.generic]) -> list[bytes]:
    """A TensorProto: dims (1), data_type (2), name (8), raw_data (9, little-endian)."""
    array = np.ascontiguousarray(array)
    dims = b"".join(_field(1, int(d)) for d in array.shape)
    data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    return [dims + _field(2, _DTYPES[array.dtype]) + _field(8, name), *_sized(9, [data])]


def _attribute(name: str, value: int | float | Sequence[int]) -> bytes:
    """An AttributeProto: name (1), f (2), i (3) or ints (8), type (20)."""
    if isinstance(value, float):
        return _field(1, name) + _field(2, value) + _field(20, _ATTR_FLOAT)
    if isinstance(value, int):
        return _field(1, name) + _field(3, value) + _field(20, _ATTR_INT)
    return _field(1, name) + b"".join(_field(8, int(v)) for v in value) + _field(20, _ATTR_INTS)


def _node(
    op: str, inputs: Sequence[str], outputs: Sequence[str], domain: str, attrs: dict[str, object]
) -> bytes:
    """A NodeProto: input (1), output (2), op_type (4), attribute (5), domain (7)."""
    out = b"".join(_field(1, i) for i in inputs) + b"".join(_field(2, o) for o in outputs)
    out += _field(4, op)
    out += b"".join(_field(5, _attribute(k, v)) for k, v in attrs.items())  # type: ignore[arg-type]
    return out + (_field(7, domain) if domain else b"")


def _value_info(name: str, dims: Sequence[int | str]) -> bytes:
    """A float ValueInfoProto: name (1), type (2): tensor_type (1): elem_type (1), shape (2) of
    dims (1), each a dim_value (1) or a dim_param (2)."""
    shape = b"".join(_field(1, _field(1, d) if isinstance(d, int) else _field(2, d)) for d in dims)
    return _field(1, name) + _field(2, _field(1, _field(1, _FLOAT) + _field(2, shape)))


class Int8Weights(Protocol):
    """A weight matrix (in, out) as int8 with one float32 scale per output column."""

    @property
    def q(self) -> npt.NDArray[np.int8]: ...
    @property
    def scale(self) -> npt.NDArray[np.float32]: ...


class LayerWeights(Protocol):
    """One BERT layer: query/key/value fused, attention output, feed-forward in and out."""

    @property
    def qkv_w(self) -> Int8Weights: ...
    @property
    def qkv_b(self) -> npt.NDArray[np.float32]: ...
    @property
    def attn_out_w(self) -> Int8Weights: ...
    @property
    def attn_out_b(self) -> npt.NDArray[np.float32]: ...
    @property
    def attn_ln_w(self) -> npt.NDArray[np.float32]: ...
    @property
    def attn_ln_b(self) -> npt.NDArray[np.float32]: ...
    @property
    def ffn_in_w(self) -> Int8Weights: ...
    @property
    def ffn_in_b(self) -> npt.NDArray[np.float32]: ...
    @property
    def ffn_out_w(self) -> Int8Weights: ...
    @property
    def ffn_out_b(self) -> npt.NDArray[np.float32]: ...
    @property
    def out_ln_w(self) -> npt.NDArray[np.float32]: ...
    @property
    def out_ln_b(self) -> npt.NDArray[np.float32]: ...


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[bytes] = []
        self.initializers: list[bytes] = []
        """Graph fields (5) of the initializers, in parts."""

    def constant(self, name: str, value: npt.ArrayLike) -> str:
        self.initializers += _sized(5, _tensor(name, np.asarray(value)))
        return name

    def node(self, op: str, inputs: Sequence[str], output: str, domain: str = "", **attrs: object) -> str:
        self.nodes.append(_node(op, inputs, [output], domain, attrs))
        return output

    def linear(self, x: str, w: Int8Weights, b: npt.NDArray[np.float32], name: str) -> str:
        """`x @ w + b` as an 8-bit `MatMulNBits` (unsigned, zero point 128)."""
        k, n = w.q.shape
        if k % BLOCK:
            raise ValueError(f"{name}: {k} input rows is not a multiple of {BLOCK}")
        blocks = (w.q.astype(np.int16) + 128).astype(np.uint8).T.reshape(n, k // BLOCK, BLOCK)
        scales = np.repeat(w.scale, k // BLOCK).astype(np.float32)
        inputs = [x, self.constant(f"{name}.w", blocks), self.constant(f"{name}.s", scales), "", ""]
        inputs.append(self.constant(f"{name}.b", b.astype(np.float32)))
        return self.node(
            "MatMulNBits",
            inputs,
            name,
            domain="com.microsoft",
            K=k,
            N=n,
            bits=8,
            block_size=BLOCK,
            accuracy_level=ACCURACY_LEVEL,
        )

    def layer_norm(self, x: str, w: npt.NDArray[np.float32], b: npt.NDArray[np.float32], name: str) -> str:
        inputs = [x, self.constant(f"{name}.w", w), self.constant(f"{name}.b", b)]
        return self.node("LayerNormalization", inputs, name, axis=-1, epsilon=1e-12)


def encoder_graph(layers: Sequence[LayerWeights], hidden: int, heads: int) -> bytes:
    """A serialized ONNX model: inputs `x` (batch, seq, hidden), the embedded tokens after their
    layer norm, and `bias` (batch, 1, 1, seq), 0 for a token and -1e9 for padding; output `h`,
    the last layer's hidden states (batch, seq, hidden)."""
    g = _Graph()
    head_dim = hidden // heads
    split = g.constant("split_heads", np.array([0, 0, 3, heads, head_dim], dtype=np.int64))
    merge = g.constant("merge_heads", np.array([0, 0, hidden], dtype=np.int64))
    scale = g.constant("scale", np.array(1.0 / np.sqrt(head_dim), dtype=np.float32))
    axis0 = g.constant("axis0", np.array([0], dtype=np.int64))
    x = "x"
    for i, layer in enumerate(layers):
        p = f"layer{i}."
        qkv = g.linear(x, layer.qkv_w, layer.qkv_b, p + "qkv")
        qkv = g.node("Reshape", [qkv, split], p + "qkv5")
        qkv = g.node("Transpose", [qkv], p + "qkvt", perm=[2, 0, 3, 1, 4])  # (3, b, heads, s, d)
        g.nodes.append(_node("Split", [qkv], [p + "q3", p + "k3", p + "v3"], "", {"axis": 0}))
        q, k, v = (g.node("Squeeze", [p + f"{n}3", axis0], p + n) for n in "qkv")
        kt = g.node("Transpose", [k], p + "kt", perm=[0, 1, 3, 2])
        scores = g.node("MatMul", [q, kt], p + "scores")
        scores = g.node("Mul", [scores, scale], p + "scaled")
        scores = g.node("Add", [scores, "bias"], p + "masked")
        probs = g.node("Softmax", [scores], p + "probs", axis=-1)
        context = g.node("MatMul", [probs, v], p + "context")
        context = g.node("Transpose", [context], p + "context_t", perm=[0, 2, 1, 3])
        context = g.node("Reshape", [context, merge], p + "context_m")
        out = g.linear(context, layer.attn_out_w, layer.attn_out_b, p + "attn_out")
        x = g.layer_norm(g.node("Add", [out, x], p + "attn_res"), layer.attn_ln_w, layer.attn_ln_b, p + "ln1")
        inner = g.node(
            "Gelu", [g.linear(x, layer.ffn_in_w, layer.ffn_in_b, p + "ffn_in")], p + "gelu", "com.microsoft"
        )
        out = g.linear(inner, layer.ffn_out_w, layer.ffn_out_b, p + "ffn_out")
        x = g.layer_norm(g.node("Add", [out, x], p + "ffn_res"), layer.out_ln_w, layer.out_ln_b, p + "ln2")
    g.node("Identity", [x], "h")
    graph = [_field(1, n) for n in g.nodes] + [_field(2, "minilm"), *g.initializers]
    graph.append(_field(11, _value_info("x", ["batch", "seq", hidden])))
    graph.append(_field(11, _value_info("bias", ["batch", 1, 1, "seq"])))
    graph.append(_field(12, _value_info("h", ["batch", "seq", hidden])))
    opsets = _field(8, _field(1, "") + _field(2, OPSET)) + _field(
        8, _field(1, "com.microsoft") + _field(2, 1)
    )
    # ModelProto: ir_version (1), producer_name (2), graph (7), opset_import (8).
    return b"".join([_field(1, IR_VERSION), _field(2, "toolbus"), *_sized(7, graph), opsets])
