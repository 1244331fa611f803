"""The specialised texts of contractions and elementwise steps: functions of the rendering's context and a step.

A contraction as the record planned it (direct BLAS calls on numpy, ``einflow.engine.kernels``; a native
convolution; an ``opt_einsum`` expression elsewhere); an elementwise step as the record rewrote it (a large
product's small factors first), block by block on threads where the record planned blocks
(``einflow.engine.blocks``). Read by :mod:`einflow.engine.render` for a step left whole and by
:mod:`einflow.engine.render_fitted` for each slice or chunk of one.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from dataclasses import replace

import numpy as np
import opt_einsum as oe

from einflow.engine import codegen
from einflow.engine.blocks import render_kernel, run_blocks
from einflow.engine.context import RenderContext
from einflow.engine.convolution import convolution_kernel
from einflow.engine.measure import NP, OPS, common_dtype, one_float_type
from einflow.engine.steps import Contract, Elementwise, Free, node_args

__all__ = ["contract_text", "elementwise_text"]


def _real_part_of(dtype: np.dtype, common: np.dtype) -> bool:
    """Whether ``dtype`` is the real type of complex ``common`` (float64 of complex128): numpy computes its
    products with the other factors in that precision, as it would after the cast (a product of two such
    reals is the real part of their complex product), so the cast, a copy per call, is left out."""
    return dtype.kind == "f" and common.kind == "c" and dtype.itemsize * 2 == common.itemsize


def contract_text(cx: RenderContext, step: Contract) -> str:
    """A contraction as the record planned it, times its scale."""
    record, backend, dialect = cx.record, cx.record.backend, cx.dialect
    fused = record.convolutions.get(step.out)
    if fused is not None:  # one native convolution (einflow.engine.convolution)
        spec, args = fused
        helper = cx.names.alias.get("convolve") or "_convolve"
        cx.namespace[helper] = convolution_kernel(backend)
        arguments = ", ".join(cx.var(register) for register in args)
        dtype = str(common_dtype(record.dtypes, step))
        return codegen.scaled(cx, f"{helper}({arguments}, {spec!r}, {dtype!r})", step.scale)
    planned = record.contractions[step.out]
    equation, shapes, orders = planned.equation, planned.shapes, planned.orders
    operands = [cx.var(register) if order == tuple(range(len(order)))
                else f"{cx.var(register)}.{dialect.permute}({order})" for register, order in zip(step.args, orders)]
    if len(step.args) > 2 or step.scale or not dialect.numpy_types:  # (torch: int64 * float32 is float32)
        # numpy's dtype rule: every pairwise step computes in the result type of all the factors, the
        # scale included (a bool or int8 pair must not saturate or wrap before a wider factor joins it);
        # two arrays alone already promote like numpy
        common = common_dtype(record.dtypes, step)
        for position, register in enumerate(step.args):
            dtype = record.dtypes[register]
            if not isinstance(dtype, type) and np.dtype(dtype) != common and not (
                    dialect.numpy_types and _real_part_of(np.dtype(dtype), common)):
                operands[position] = codegen.astype(cx, operands[position], str(common))
    output_elements = math.prod(record.shapes[step.out])
    scaled_inside = False
    fresh = in_place = False
    if backend.pairwise_kernels:
        # each pairwise step as a direct call: a GEMM-shaped one as dot / matmul on (transposed) views,
        # an elementwise product as `*`, the rest einsum (torch: through einflow.engine.backends.torch_ops)
        ops = cx.names.once.get("ops")
        if not backend.numpy_native and ops is None:  # (torch: its ops module)
            ops = cx.names.once["ops"] = cx.fresh("_ops")
            cx.namespace[ops] = importlib.import_module(backend.einsum_backend)
        in_place, fresh = planned.in_place, planned.fresh
        # numpy: the scale multiplies the smallest operand, intermediate or result (the dot product in
        # `w[i] t[i] t[p]`); torch scales the contraction's own new array in place (below)
        scale = codegen.scaled(cx, "", step.scale) if step.scale and backend.numpy_native else None
        assert planned.text is not None
        template = _product_in_place(cx, step, planned.text, planned.orders) if backend.numpy_native else None
        text = (template or planned.text).format(*operands, scale=scale).replace(NP, cx.names.alias["np"]) \
            .replace(OPS, ops or "_ops")
        scaled_inside = scale is not None
    else:
        if step.scale:
            smallest = min(range(len(shapes)), key=lambda k: math.prod(shapes[k]))
            if math.prod(shapes[smallest]) < output_elements:
                scaled_inside = True
                operands[smallest] = "(" + codegen.scaled(cx, operands[smallest], step.scale) + ")"
        name = cx.fresh(f"_contract{step.out}")
        cx.namespace[name] = oe.contract_expression(equation, *shapes, optimize=planned.path)
        text = f"{name}({', '.join(operands)}, backend={backend.einsum_backend!r})"
    if step.scale and not scaled_inside:
        scaled = codegen.scaled(cx, "{x}", step.scale)
        if dialect.in_place and fresh and in_place and scaled.startswith("{x} * "):
            # the contraction's own new array, scaled in place
            return f"{text}.mul_({scaled[len('{x} * '):]})"
        text = codegen.scaled(cx, text, step.scale)
    return text


#: a factor of a broadcast product in a contraction's text: an operand, transposed and/or with new axes
_FACTOR = r"\{\d+\}(?:\.transpose\(\([\d, ]*\)\))?(?:\[[\w:, ]*\])?"
#: a product of two factors, one of them an operand as it is (``({0}[:, None, :] * {1})``)
_PRODUCT = re.compile(rf"\((?P<left>{_FACTOR}) \* (?P<right>{_FACTOR})\)")

#: the least bytes an operand must hold to be multiplied in place (as render.RELEASE_BYTES: smaller arrays are
#: not released early either)
_IN_PLACE_BYTES = 1 << 16


def _product_in_place(cx: RenderContext, step: Contract, text: str, orders: tuple[tuple[int, ...], ...]) -> str | None:
    """numpy: ``text`` with its broadcast product of an operand that this step frees (a dead tangent times a
    factor, before their matrix product) made in that operand's memory, ``multiply(a, b, out=a)``: no new array,
    whose fresh pages cost more than the multiplication (1,200 page faults for a 4.9 MB product). None where
    no operand qualifies: an intermediate made by a matrix product or multiplication of its own (not a view, not
    an input), stored in its axes' order, read once here, of the step's one floating type, released right after
    this step, and the step computed whole (not slice by slice)."""
    record, fitting = cx.record, cx.fitting
    if fitting is None or step.out in fitting.budgets or step.scale:
        return None
    dtype = record.dtypes[step.out]
    if isinstance(dtype, type) or np.dtype(dtype).kind != "f" or any(record.dtypes[r] != dtype for r in step.args):
        return None
    dying = _released_after(cx, step)
    viewed = set(record.views.values()) | set(record.views)
    for match in _PRODUCT.finditer(text):
        for own, other in (("left", "right"), ("right", "left")):
            operand = match.group(own)
            if not re.fullmatch(r"\{\d+\}", operand):
                continue
            position = int(operand[1:-1])
            register = step.args[position]
            made = record.contractions.get(register)
            if register not in dying or register in viewed or step.args.count(register) != 1 or \
                    made is None or not made.fresh or orders[position] != tuple(range(len(orders[position]))) or \
                    math.prod(record.shapes[register]) * record.itemsize(register) < _IN_PLACE_BYTES:
                continue
            rewritten = f"{NP}.multiply({operand}, {match.group(other)}, out={operand})"
            return text[:match.start()] + rewritten + text[match.end():]
    return None


def _released_after(cx: RenderContext, step: Contract) -> set[int]:
    """The registers the steps right after ``step`` release (its operands that no later step reads), unless a
    later block computation still holds them."""
    steps = cx.lowered.steps
    position = next((k for k, s in enumerate(steps) if s is step), None)
    if position is None:
        return set()
    released: set[int] = set()
    for later in steps[position + 1:]:
        if not isinstance(later, Free):
            break
        released.update(later.registers)
    held = cx.fitting.held() | {r for registers in cx.fitting.deferred.values() for r in registers}
    return released - held - set(cx.fitting.windows)


def elementwise_text(cx: RenderContext, step: Elementwise) -> str:
    """An elementwise step as the record planned it (torch: in place on the arrays it makes, where it reads and
    makes one floating type)."""
    if one_float_type(cx.dialect, cx.record.dtypes, node_args(step.expr), step.out):
        cx = replace(cx, in_place=True)
    planned = cx.record.expressions[step.out]
    step = replace(step, expr=planned.expr)  # a large product's small factors multiplied first
    # (a step fused into a chunked reduction, or computed in chunks into its result, is rendered for one
    # chunk there: one expression)
    fitting = cx.fitting
    if planned.blocks is not None and step.out not in fitting.fused and step.out not in fitting.pieces:
        return _blocks_text(cx, step)
    return codegen.elementwise(cx, step)


def _blocks_text(cx: RenderContext, step: Elementwise) -> str:
    """The step computed block by block (``einflow.engine.blocks``) as the record planned it."""
    blocks = cx.record.expressions[step.out].blocks
    assert blocks is not None
    shape = cx.record.shapes[step.out]
    name = cx.fresh(f"_kernel{step.out}")
    kernel = render_kernel(name, step.expr, cx.names.alias["np"], functools.partial(codegen.number, cx),
                           functools.partial(codegen.size, cx))
    assert kernel is not None
    operands = [codegen.arg(cx, arg) for arg in kernel.operands]
    cx.kernels.append(kernel.text)
    runner = cx.names.once.get("blocks")
    if runner is None:
        runner = cx.names.once["blocks"] = cx.fresh("_run_blocks")
        cx.namespace[runner] = run_blocks
    listed = ", ".join(operands) + ("," if len(operands) == 1 else "")
    return (f"{runner}({name}, ({listed}), {blocks.sliced!r}, {shape!r}, "
            f"{str(np.dtype(cx.record.dtypes[step.out]))!r}, {blocks.rows}, {kernel.buffers})")
