"""FLOPs and bytes of one profiled op, counted from the shapes and dtypes the profiler recorded.

The profiler counts FLOPs for a few ops (mm, addmm, bmm, convolutions, mul, add) and bytes for
none. The bytes here follow gpulab.hardware's convention: each input read once, the output
written once, the least traffic any kernel could get away with. So an intensity from these
counts is an upper bound, like the ones in lessons/01.

    op_bytes("aten::mm", [[64, 256], [256, 512]], ["float", "float"])
    # 4 * (64*256 + 256*512 + 64*512): A and B read, C written, 4 bytes each

Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import math

# The dtype names the profiler records (c10's), and bytes per element.
ELEMENT_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
# The roofline column for each floating dtype (see gpulab.gpu_specs.DTYPES).
ROOFLINE_DTYPE = {"float": "fp32", "double": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
                  "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8"}

# Ops that make a new view of the same memory (or only allocate): no bytes move.
VIEW_OPS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::_reshape_alias", "aten::t",
    "aten::transpose", "aten::permute", "aten::expand", "aten::expand_as", "aten::as_strided",
    "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::narrow",
    "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::unflatten",
    "aten::detach", "aten::alias", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::empty", "aten::empty_strided", "aten::empty_like",
    "aten::view_as", "aten::numpy_T", "aten::result_type", "aten::is_nonzero",
    "aten::_has_compatible_shallow_copy_type", "aten::set_", "aten::resize_",
})
# Ops that copy only when they must (a dtype/device change, a non-contiguous input): they move
# bytes only when some op below them copies (aten::to -> aten::_to_copy -> aten::copy_).
COPY_IF_NEEDED = frozenset({"aten::to", "aten::contiguous", "aten::reshape", "aten::flatten",
                            "aten::type_as"})
# Ops that write a tensor the size of their first argument without reading it. (Factories
# such as aten::zeros take no tensor, so the profiler records no size for them: counted 0.)
WRITE_ONLY = frozenset({"aten::zero_", "aten::fill_", "aten::normal_", "aten::uniform_",
                        "aten::random_", "aten::bernoulli_", "aten::zeros_like",
                        "aten::ones_like", "aten::full_like"})
MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                     "aten::linear"})


def _tensors(shapes, dtypes) -> list[tuple[int, str]]:
    """(elements, dtype) of each tensor argument; scalars and lists have no known dtype."""
    found = []
    for shape, dtype in zip(shapes, dtypes, strict=False):
        if dtype in ELEMENT_BYTES and isinstance(shape, (list, tuple)):
            found.append((math.prod(shape), dtype))
    return found


def _matmul_output(name: str, shapes) -> int | None:
    """Elements of a matmul's result, from its operands' shapes; None when they do not fit."""
    dims = [list(s) for s in shapes if isinstance(s, (list, tuple)) and len(s) >= 1]
    try:
        if name in ("aten::addmm", "aten::baddbmm"):  # (bias, a, b)
            a, b = dims[1], dims[2]
        elif name == "aten::linear":  # (x, weight (out, in), bias): x @ weight.T
            return math.prod(dims[0][:-1]) * dims[1][0]
        else:
            a, b = dims[0], dims[1]
        return math.prod(a[:-1]) * b[-1]
    except IndexError:
        return None


def moves_data(name: str, descendants=()) -> bool:
    """Whether an op called with these ops below it moves any bytes: not a view, and not a
    copy-if-needed op (aten::to, aten::contiguous, ...) that found nothing to copy."""
    if name in VIEW_OPS:
        return False
    if name in COPY_IF_NEEDED:
        return any(d not in VIEW_OPS and d not in COPY_IF_NEEDED for d in descendants)
    return True


def op_bytes(name: str, shapes, dtypes) -> int:
    """Least bytes `name` moves to and from memory, given its arguments' shapes and dtypes:
    inputs read once and the output written once. The output is sized from the operands for
    matmuls and taken as big as the largest input otherwise (elementwise ops, in-place updates);
    a reduction writes less, so its count is a little high."""
    if name in VIEW_OPS:  # (moves_data decides for the copy-if-needed ops)
        return 0
    tensors = _tensors(shapes, dtypes)
    if not tensors:
        return 0
    sizes = [n * ELEMENT_BYTES[d] for n, d in tensors]
    if name in WRITE_ONLY:
        return max(sizes)
    if name == "aten::copy_":  # (dst, src): read src, write dst
        return sizes[0] + (sizes[1] if len(sizes) > 1 else sizes[0])
    if name in MATMULS:
        out = _matmul_output(name, shapes)
        if out is not None:
            return sum(sizes) + out * ELEMENT_BYTES[tensors[0][1]]
    return sum(sizes) + max(sizes)


def op_dtype(dtypes) -> str:
    """The roofline column of an op: its first floating-point argument's dtype, else fp32."""
    for d in dtypes:
        if d in ROOFLINE_DTYPE:
            return ROOFLINE_DTYPE[d]
    return "fp32"
