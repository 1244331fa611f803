"""Programs on torch tensors: generated torch code, and one autograd node whose backward is einflow's VJP.

A call with tensors that require grad (and grad mode on) goes through :class:`EinflowFunction`: the
forward runs the program's torch plan, the backward runs ``einflow.vjp(program, wrt=<the inputs that
need grad>)`` (derived once per program and set of inputs) on the saved inputs and the incoming
gradient. That call goes through this module again, so with ``create_graph=True`` the backward is
itself a differentiable einflow node and double backward works.

The node is written in ``torch.func``'s form (``setup_context``, a ``jvp`` rule running
``einflow.jvp(program)``, a ``vmap`` rule running the program batched by a leading index), so the call
works inside ``torch.func.grad``, ``jacrev``, ``jacfwd``, ``hessian`` and ``vmap`` (per-example gradients:
``vmap(grad(f))``), each derivative einflow's.

A program with a scalar value (a loss) does better in a training step: its forward pass runs
``einflow.value_and_grad(program, wrt=<the inputs that need grad>)``, value and gradients with shared
work, and a plain backward pass only scales those gradients by the incoming scalar (the VJP of a scalar
function is linear in its cotangent). A backward pass that builds a graph (``create_graph=True``) runs
the VJP programs as above, so second derivatives stay einflow's.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from einflow.engine.backends import get_backend
from einflow.engine.backends.torch_backend import numpy_dtype
from einflow.frameworks.programs import batched_program, jvp_program, plan_for, value_and_grad_program, vjp_program
from einflow.lang.errors import BackendError, DerivativeError

__all__ = ["EinflowFunction", "BatchedFunction", "call"]


def _signature(value: Any) -> tuple[Any, ...]:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), numpy_dtype(value.dtype), value.device
    return (), type(value), None


def call(program: Any, engine: Any, values: list[Any], optimize: Any, memory_limit: Any) -> Any:
    """Run ``program`` on torch tensors; tensors that require grad make the result part of the graph."""
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
    converted: list[Any] = []
    for tensor, value in zip(program.info.inputs, values):
        try:
            converted.append(engine.asarray(value, device=device))
        except (ValueError, TypeError) as error:
            raise BackendError(f"tensor {tensor!r}: cannot use this input as a tensor ({error})") from None
    signature = tuple(_signature(value) for value in converted)
    plan = plan_for(program, engine, converted, signature, optimize, memory_limit)
    # Python numbers stay weak in the plan (signature) but are 0-d tensors for torch's functions: of the
    # inputs' floating type when there is one (as a weak number would compute), else float64 / int64
    floating = [v.dtype for v in converted if isinstance(v, torch.Tensor) and v.is_floating_point()]
    number_float = functools.reduce(torch.promote_types, floating) if floating else None
    arrays = [v if isinstance(v, torch.Tensor) else
              torch.tensor(v, dtype=number_float or (torch.float64 if isinstance(v, float) else torch.int64),
                           device=device) for v in converted]
    needs_grad = torch.is_grad_enabled() and any(v.requires_grad for v in arrays)
    if plan.returns_tuple:
        if _only_batched(arrays):  # under vmap alone: the program batched by an index, run once
            return BatchedFunction.apply(_Node(program, plan, signature, optimize, memory_limit), *arrays)
        # several results: torch differentiates the generated torch code itself
        return plan.run(arrays)
    if not (needs_grad or _transformed()):
        return plan.run(arrays)
    return EinflowFunction.apply(_Node(program, plan, signature, optimize, memory_limit), *arrays)


def _is_one(cotangent: Any) -> bool:
    """Whether a 0-d CPU cotangent is exactly 1 (on other devices reading it would wait for the device)."""
    return cotangent.device.type == "cpu" and cotangent.dim() == 0 and cotangent.item() == 1


class _Node:
    """What the autograd node needs: the program, its plan for these inputs (and their signature), the options."""

    __slots__ = ("program", "plan", "signature", "optimize", "memory_limit", "gradients")

    def __init__(self, program: Any, plan: Any, signature: tuple[Any, ...], optimize: Any, memory_limit: Any) -> None:
        self.program, self.plan, self.signature = program, plan, signature
        self.optimize, self.memory_limit = optimize, memory_limit
        self.gradients: dict[str, Any] | None = None  # forward -> setup_context: gradients computed with the value

    def value_and_grad(self, wanted: tuple[str, ...], arrays: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
        """The scalar program's value and its gradients for ``wanted``, by the fused program's plan.

        The fused program, its plan for this signature and which inputs it reads are found once per
        (plan, wanted) and kept on the plan: a training step runs the generated code directly.
        """
        found = self.plan.derived.get(("value_and_grad", wanted))
        if found is None:
            fused = value_and_grad_program(self.program, wanted)
            names = self.program.info.inputs
            positions = tuple(names.index(name) for name in fused.info.inputs)
            signature = tuple(self.signature[k] for k in positions)
            fused_plan = plan_for(fused, get_backend("torch"), [arrays[k] for k in positions], signature,
                                  self.optimize, self.memory_limit)
            found = self.plan.derived[("value_and_grad", wanted)] = (fused_plan, positions)
        fused_plan, positions = found
        value, *gradients = fused_plan.run([arrays[k] for k in positions])
        return value, tuple(gradients)


class EinflowFunction(torch.autograd.Function):
    """forward: the program's plan; backward: its VJP program; jvp: its JVP program (each called through here again).

    Written in ``torch.func``'s form (``forward`` without ``ctx``, ``setup_context``, ``jvp``), so the
    call works inside ``torch.func.grad``/``jacrev``/``jacfwd``/``hessian``/``vmap``. Under ``vmap``
    the program is batched by an index (:func:`~einflow.frameworks.programs.batched_program`: the
    batched inputs and all that depends on them get a leading index) and runs once for the whole batch;
    the derivative programs called from ``backward``/``jvp`` are batched the same way.
    """

    @staticmethod
    def forward(node: _Node, *arrays: Any) -> Any:  # type: ignore[override]
        # a scalar program whose inputs require grad (plain autograd: a loss in a training step) computes
        # its gradients with its value; under torch.func the inputs arrive unwrapped and this is skipped
        if node.plan.output_shapes[0] == () and not _transformed():
            names = node.program.info.inputs
            wanted = tuple(name for name, array in zip(names, arrays) if array.requires_grad)
            if wanted:
                value, gradients = node.value_and_grad(wanted, arrays)
                node.gradients = dict(zip(wanted, gradients))
                return _fresh(value, arrays)
        return _fresh(node.plan.run(list(arrays)), arrays)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        node, *arrays = inputs
        ctx.node = node
        ctx.output = (output.shape, output.dtype, output.device)  # what a JVP must look like
        ctx.gradients, node.gradients = node.gradients, None
        ctx.save_for_backward(*arrays)
        ctx.save_for_forward(*arrays)

    @staticmethod
    def backward(ctx: Any, cotangent: Any) -> Any:  # type: ignore[override]
        node: _Node = ctx.node
        arrays = ctx.saved_tensors
        names = node.program.info.inputs
        wanted = tuple(name for name, need in zip(names, ctx.needs_input_grad[1:]) if need)
        if not wanted:
            return (None,) * (len(arrays) + 1)
        if ctx.gradients is not None and not torch.is_grad_enabled() and set(wanted) <= set(ctx.gradients):
            # a scalar program's gradients, computed with its value: the VJP is cotangent * gradient (a loss's
            # own backward seeds it with 1: on the CPU, where reading it costs nothing, that skips a pass)
            if _is_one(cotangent):
                return (None, *(ctx.gradients.get(name) if name in wanted else None for name in names))
            return (None, *(None if name not in wanted else ctx.gradients[name] * cotangent for name in names))
        bound = dict(zip(names, arrays))
        # create_graph: one single-result VJP program per input, each an einflow node of its own (so the
        # second derivative is einflow's too); otherwise one program computing all gradients together. Under
        # torch.func a graph is always built, but when only vmap is left around this grad (per-example
        # gradients: vmap(grad(f))) nothing differentiates the gradients again: one program, batched
        together = not torch.is_grad_enabled() or _only_batched((*arrays, cotangent), below_top=True)
        groups = [(name,) for name in wanted] if not together and len(wanted) > 1 else [wanted]
        by_name: dict[str, Any] = {}
        for group in groups:
            program, cotangent_name = vjp_program(node.program, group)
            bound[cotangent_name] = cotangent
            given = {name: bound[name] for name in program.info.inputs}
            if len(group) > 1 and _transformed():
                gradients = _run_batched(program, given, node)
            else:
                gradients = program(given, optimize=node.optimize, memory_limit=node.memory_limit)
            by_name.update(zip(group, gradients if len(group) > 1 else (gradients,)))
        results: list[Any] = [None]
        for name, array in zip(names, arrays):
            results.append(_like(by_name.get(name), array))
        return tuple(results)

    @staticmethod
    def jvp(ctx: Any, node_tangent: Any, *tangents: Any) -> Any:  # type: ignore[override]
        """Forward mode (``torch.func.jvp``/``jacfwd``/``hessian``): the program's JVP program, einflow's."""
        node: _Node = ctx.node
        arrays = ctx.saved_tensors
        names = node.program.info.inputs
        wanted = tuple(name for name, array, tangent in zip(names, arrays, tangents)
                       if tangent is not None and (array.is_floating_point() or array.is_complex()))
        shape, dtype, device = ctx.output
        if not wanted:
            return torch.zeros(shape, dtype=dtype, device=device)
        program, tangent_names = jvp_program(node.program, wanted)
        bound = dict(zip(names, arrays))
        given = dict(zip(names, tangents))
        bound.update({tangent: given[name] for name, tangent in zip(wanted, tangent_names)})
        result = program({name: bound[name] for name in program.info.inputs}, optimize=node.optimize,
                         memory_limit=node.memory_limit)
        return _like(result, torch.empty(shape, dtype=dtype, device=device))

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], node: _Node, *arrays: Any) -> tuple[Any, Any]:
        """``torch.func.vmap``: the program with a batch index on the batched inputs, run once."""
        value, carries = _run_with_batch_index(node, in_dims[1:], arrays)
        return value, 0 if carries[0] else None


class BatchedFunction(torch.autograd.Function):
    """A program with several results under ``vmap`` alone: batched by an index (``batched_program``), run once.

    Nothing differentiates it (it is used only where no grad or jvp transform, and no tensor that requires
    grad, is around the call); ``backward`` says so rather than returning a wrong derivative.
    """

    @staticmethod
    def forward(node: _Node, *arrays: Any) -> Any:  # type: ignore[override]
        return tuple(node.plan.run(list(arrays)))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *cotangents: Any) -> Any:  # type: ignore[override]  # pragma: no cover - never asked
        raise DerivativeError("a program with several results run under vmap is not differentiated by einflow; "
                              "call it on tensors that require grad, outside vmap")

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], node: _Node, *arrays: Any) -> tuple[Any, Any]:
        values, carries = _run_with_batch_index(node, in_dims[1:], arrays)
        return tuple(values), tuple(0 if carried else None for carried in carries)


def _run_with_batch_index(node: _Node, dims: tuple[Any, ...], arrays: tuple[Any, ...]) -> tuple[Any, tuple[bool, ...]]:
    """A vmap rule's work: the node's program with a leading batch index on the inputs batched along ``dims``
    (moved to the front), called once; its value(s) and which of them carry the batch index."""
    names = node.program.info.inputs
    program, carries = batched_program(node.program, tuple(name for name, dim in zip(names, dims) if dim is not None))
    moved = {name: array if dim is None else array.movedim(dim, 0) for name, array, dim in zip(names, arrays, dims)}
    value = program({name: moved[name] for name in program.info.inputs}, optimize=node.optimize,
                    memory_limit=node.memory_limit)
    return value, carries


def _run_batched(program: Any, given: dict[str, Any], node: _Node) -> Any:
    """A several-result derivative program under vmap: through :class:`BatchedFunction` (one batched plan)."""
    engine = get_backend("torch")
    arrays = [given[name] for name in program.info.inputs]
    signature = tuple(_signature(array) for array in arrays)
    plan = plan_for(program, engine, arrays, signature, node.optimize, node.memory_limit)
    return BatchedFunction.apply(_Node(program, plan, signature, node.optimize, node.memory_limit), *arrays)


def _base(tensor: Any) -> Any:
    """The plain tensor under torch.func's wrappers (batched and grad-tracking tensors)."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(tensor):
        tensor = functorch.get_unwrapped(tensor)
    return tensor


def _only_batched(arrays: Any, below_top: bool = False) -> bool:
    """Whether only ``vmap`` transforms are active (``below_top``: besides the innermost one, the grad transform
    running a backward pass) and no tensor under them requires grad: nothing will differentiate the result."""
    stack = torch._C._functorch.get_interpreter_stack()
    if not stack:
        return False
    vmap = torch._C._functorch.TransformType.Vmap
    outer = stack[:-1] if below_top else stack
    if any(interpreter.key() != vmap for interpreter in outer):
        return False
    return not any(isinstance(array, torch.Tensor) and _base(array).requires_grad for array in arrays)


def _fresh(value: Any, arrays: tuple[Any, ...]) -> Any:
    """``value``, or a view of it when it is one of the inputs (``y[i] = x[i]``): torch saves no input as an output."""
    return value.view_as(value) if any(value is array for array in arrays) else value


def _like(value: Any, array: Any) -> Any:
    """A derivative result as a tensor of ``array``'s shape (a constant result may be a number or broadcast)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(value, dtype=array.dtype, device=array.device)
    if value.dtype != array.dtype and (array.is_floating_point() or array.is_complex()):
        value = value.to(array.dtype)
    if value.shape != array.shape:
        value = value.expand(array.shape)
    return value


def _transformed() -> bool:
    """Whether a ``torch.func`` transform (grad, vmap, jvp, ...) is active around this call."""
    return torch._C._functorch.peek_interpreter_stack() is not None
