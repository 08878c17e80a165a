"""FLOP counting of model forwards and training steps (torch only) and the closed-form counts of ViTs.

Convention (printed by the tools as :data:`FLOP_CONVENTION`): **FLOPs = 2 x MACs**, one
multiply-add counts as two FLOPs, and only matmul-like work is counted: ``mm`` / ``addmm`` /
``bmm`` / ``baddbmm`` (so ``nn.Linear``, ``torch.matmul`` and ``torch.einsum``, which lower to
them), convolutions (except depthwise 1-D ones, the Mamba-2 conv1d: on CPU it runs
element-wise, so it counts zero on every device), scaled-dot-product attention (4 N^2 D: both
of its matmuls) and the Triton linear-attention autograd Function (counted from its input
shapes, below).  Element-wise ops, norms, softmax, feature maps and interpolation count zero,
as in fvcore / mmengine.

:class:`FlopCounter` wraps :class:`torch.utils.flop_counter.FlopCounterMode` (a dispatch mode
that counts aten ops by shape, so it also works on ``torch.device('meta')`` tensors) and adds:

* SDPA kernels the upstream registry misses: ``_scaled_dot_product_flash_attention_for_cpu``
  (the CPU path, counted 0 upstream), ``_scaled_dot_product_fused_attention_overrideable`` and
  ``_scaled_dot_product_attention_math`` where this torch has them, and the backwards of the
  first two and of the CUDA kernels (twice the forward, what the ``bmm`` of the math
  decomposition count on meta tensors; upstream counts the CUDA backwards with the recomputed
  scores, 2.5 x the forward);
* custom ``torch.autograd.Function`` classes, whose forward may launch kernels the dispatch
  mode never sees (Triton): while counting, the class's ``apply`` is wrapped so that its FLOPs
  come from a formula of its inputs and whatever aten FLOPs its forward issued are discarded
  (no double counting).  Two Functions are registered by default when their kernel path can
  be taken (triton installed and CUDA or ``TRITON_INTERPRET=1``): the Triton linear-attention
  Function of :mod:`mmlinvit.ops.linear_attention.triton_kernel`
  (:func:`linear_attention_function_flops`) and the Triton SSD-scan Function of
  :mod:`mmlinvit.ops.ssd.triton_kernel` (:func:`ssd_scan_function_flops`).  Each formula
  equals what the PyTorch path is counted, so a model counts the same on either backend; a
  backward run inside the counter adds twice the forward formula (each matmul's gradients are
  two matmuls of its size), which is also what the PyTorch paths count;
* the Mamba-2 SSD scan at its configured ``chunk_size`` on every backend: without gradients
  the PyTorch scan normally runs its inference form in chunks of at most
  :data:`mmlinvit.ops.ssd.torch_impl.INFERENCE_CHUNK` (64) tokens, a CPU speed choice whose
  matmul count is smaller (2 G L Q N + 2 H L Q P shrink with Q); while counting
  (``ssd_chunk_form=True``, the default) the scan takes its chunked form at ``chunk_size``
  instead (``INFERENCE_FORM`` is switched off inside the counter; outputs agree up to
  rounding), the algorithm training and the Triton kernel run.  An Adventurer therefore counts
  the same on CPU, on meta tensors and on CUDA, with or without gradients.

Closed forms (:func:`analytic_vit_flops`), per layer, N tokens, width D, d = D / H:
GEMMs (qkv, proj, MLP) 8 N D^2 + 4 N D M_h (= 24 N D^2 for M_h = 4 D); softmax attention
4 N^2 D; kernel linear attention / InLine 4 N d D, plus 2 N D for the kernel attention's
normaliser mat-vec (``exact=True``; InLine's centred form has none).  The patch embedding adds 2 P (c p^2) D for P patches.
"""
import importlib
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from mmlinvit.backbones.vit import operator_name
from mmlinvit.ops.ssd import torch_impl as ssd_torch_impl
from mmlinvit.ops.triton_utils import triton_available, triton_interpreter_enabled

#: The counting convention, stated by every tool that prints FLOPs.
FLOP_CONVENTION = ('FLOPs = 2 x MACs (one multiply-add = 2 FLOPs; matmul, conv, SDPA and the '
                   'linear-attention and SSD-scan kernels counted, the SSD scan at its '
                   'configured chunk size; element-wise ops, norms, softmax and the Mamba-2 '
                   'depthwise conv1d, which runs element-wise, not)')

#: Module holding the Triton linear-attention autograd Function (imports triton).
TRITON_LINEAR_ATTENTION_MODULE = 'mmlinvit.ops.linear_attention.triton_kernel'
#: Module holding the Triton SSD-scan autograd Function (imports triton).
TRITON_SSD_SCAN_MODULE = 'mmlinvit.ops.ssd.triton_kernel'

#: Attention operators with a closed-form count in :func:`attention_flops`.
ANALYTIC_OPERATORS = ('softmax', 'elu', 'relu', 'identity', 'inline')
_LINEAR_ANALYTIC_OPERATORS = ('elu', 'relu', 'identity', 'inline')

FunctionFlopFormula = Callable[..., int]
Shape = Sequence[int]


# ---------------------------------------------------------------------------------- formulas
def sdpa_flops(query_shape: Shape, key_shape: Shape, value_shape: Shape) -> int:
    """FLOPs of non-causal scaled-dot-product attention: Q K^T and A V, 2 x MACs each.

    Args:
        query_shape: (..., N, d) query shape (leading dims are batch / heads).
        key_shape: (..., M, d) key shape.
        value_shape: (..., M, e) value shape.

    Returns:
        ``2 * lead * N * M * d + 2 * lead * N * M * e``; for self-attention with H heads of
        width d (D = H d) and batch 1 this is 4 N^2 D.
    """
    if len(query_shape) < 2 or len(key_shape) != len(query_shape) or \
            len(value_shape) != len(query_shape):
        raise ValueError(f'sdpa_flops needs q (..., N, d), k (..., M, d), v (..., M, e) of equal '
                         f'rank; got {tuple(query_shape)}, {tuple(key_shape)}, '
                         f'{tuple(value_shape)}')
    lead = math.prod(query_shape[:-2])
    n, d = query_shape[-2], query_shape[-1]
    m, e = key_shape[-2], value_shape[-1]
    return 2 * lead * n * m * d + 2 * lead * n * m * e


def _sdpa_op_formula(query_shape: Shape, key_shape: Shape, value_shape: Shape, *args: Any,
                     out_shape: Any = None, **kwargs: Any) -> int:
    """FlopCounterMode formula (arguments already turned into shapes)."""
    return sdpa_flops(query_shape, key_shape, value_shape)


def _sdpa_backward_op_formula(grad_out_shape: Shape, query_shape: Shape, key_shape: Shape,
                              value_shape: Shape, *args: Any, out_shape: Any = None,
                              **kwargs: Any) -> int:
    """FlopCounterMode formula of an SDPA backward: dV, dP, dQ, dK are four matmuls, twice the
    forward (as upstream's rules count the flash / efficient / cuDNN backwards)."""
    return 2 * sdpa_flops(query_shape, key_shape, value_shape)


def _is_depthwise_conv1d(x_shape: Shape, w_shape: Shape, transposed: bool, groups: int) -> bool:
    """A 1-D convolution with one input channel per group and more than one group (the
    Mamba-2 conv1d)."""
    return (not transposed and len(w_shape) == 3 and w_shape[1] == 1 and groups > 1
            and groups == x_shape[1])


def _conv_op_formula(x_shape: Shape, w_shape: Shape, bias: Any, stride: Any, padding: Any,
                     dilation: Any, transposed: bool, output_padding: Any, groups: int,
                     *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """Upstream's convolution rule (``aten.convolution`` / ``_convolution`` /
    ``convolution_overrideable`` arguments), except a depthwise conv1d counts zero: on CPU the
    Mamba-2 conv1d runs as shifted multiply-adds (element-wise, uncounted), on meta tensors
    and on CUDA as ``nn.Conv1d``; so that a model counts the same everywhere it counts zero
    everywhere."""
    if _is_depthwise_conv1d(x_shape, w_shape, transposed, groups):
        return 0
    return flop_counter.conv_flop.__wrapped__(x_shape, w_shape, bias, stride, padding,
                                              dilation, transposed, output_padding, groups,
                                              *args, out_shape=out_shape, **kwargs)


def _conv_backward_op_formula(grad_out_shape: Shape, x_shape: Shape, w_shape: Shape,
                              bias_sizes: Any, stride: Any, padding: Any, dilation: Any,
                              transposed: bool, output_padding: Any, groups: int, *args: Any,
                              out_shape: Any = None, **kwargs: Any) -> int:
    """Upstream's ``aten.convolution_backward`` rule, with a depthwise conv1d counting zero."""
    if _is_depthwise_conv1d(x_shape, w_shape, transposed, groups):
        return 0
    return flop_counter.conv_backward_flop.__wrapped__(
        grad_out_shape, x_shape, w_shape, bias_sizes, stride, padding, dilation, transposed,
        output_padding, groups, *args, out_shape=out_shape, **kwargs)


def _conv_ops() -> Dict[Any, Callable[..., int]]:
    """The convolution ops taking ``(input, weight, bias, stride, padding, dilation,
    transposed, output_padding, groups, ...)`` (and the backward), mapped to the rules above."""
    aten = torch.ops.aten
    forward = [aten.convolution, aten._convolution, aten.convolution_overrideable]
    return {**{op: _conv_op_formula for op in forward},
            aten.convolution_backward: _conv_backward_op_formula}


def linear_attention_function_flops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    *args: Any, **kwargs: Any) -> int:
    """FLOPs of one non-causal linear-attention call from its (B, H, N, d) inputs.

    Counted like the PyTorch path (:func:`~mmlinvit.ops.linear_attention.linear_attention_torch`
    / ``inline_attention_torch``): the state ``phi(K)^T V`` (2 B H M d e), its application
    ``phi(Q) S`` (2 B H N d e) and, for kernel attention, the normaliser mat-vec (2 B H N d;
    InLine's centred form ``s q S_c + vbar`` has none).  With M = N, e = d and D = H d that
    is 4 N d D + 2 N D (InLine: 4 N d D) per batch element.

    Args:
        q: Queries (..., N, d).
        k: Keys (..., M, d).
        v: Values (..., M, e).
        *args: Remaining Function arguments: the feature map code, then whether it is
            InLine (the Triton Function's ``inline`` flag); the rest ignored.
        **kwargs: Ignored.
    """
    lead = math.prod(q.shape[:-2])
    n, d = q.shape[-2], q.shape[-1]
    m, e = k.shape[-2], v.shape[-1]
    inline = len(args) > 1 and bool(args[1])
    return 2 * lead * m * d * e + 2 * lead * n * d * e + (0 if inline else 2 * lead * n * d)


def extra_sdpa_ops() -> Tuple[Any, ...]:
    """SDPA aten ops of this torch build that :class:`FlopCounter` adds to the registry."""
    names = ('_scaled_dot_product_flash_attention_for_cpu',
             '_scaled_dot_product_fused_attention_overrideable',
             '_scaled_dot_product_attention_math')
    return tuple(getattr(torch.ops.aten, name) for name in names
                 if hasattr(torch.ops.aten, name))


def extra_sdpa_backward_ops() -> Tuple[Any, ...]:
    """SDPA backwards counted as twice the forward (arguments start with grad_out, q, k, v):
    those of :func:`extra_sdpa_ops` and the CUDA kernels', which upstream counts with the
    recomputed scores (5 bmm, 2.5 x the forward), so that a training step counts the same on
    CUDA as on CPU and on meta tensors (where SDPA decomposes into bmm: 2 x the forward)."""
    names = ('_scaled_dot_product_flash_attention_for_cpu_backward',
             '_scaled_dot_product_fused_attention_overrideable_backward',
             '_scaled_dot_product_flash_attention_backward',
             '_scaled_dot_product_efficient_attention_backward',
             '_scaled_dot_product_cudnn_attention_backward')
    return tuple(getattr(torch.ops.aten, name) for name in names
                 if hasattr(torch.ops.aten, name))


def ssd_scan_function_flops(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                            B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor],
                            chunk_size: int, *args: Any, **kwargs: Any) -> int:
    """FLOPs of one Mamba-2 SSD scan from its inputs, at chunk length ``Q = chunk_size``.

    Counted like the chunked PyTorch form (:func:`mmlinvit.ops.ssd.ssd_scan_torch` with
    gradients, which pads the L tokens to ``Lp = ceil(L / Q) Q``), per batch element:
    the scores ``C_i . B_j`` of each chunk per B/C group (2 G Lp Q N), their application to
    ``dt x`` per head (2 H Lp Q P), each chunk's own state ``sum_j B_j (dt x)_j^T``
    (2 H Lp N P) and the read-out ``C_i h`` of the state entering the chunk (2 H Lp N P).
    Decays, ``D x`` and the state recurrence are element-wise (not counted).

    Args:
        x: Inputs (batch, L, H, P).
        dt: Step sizes (batch, L, H), unused.
        A: (H,), unused.
        B: (batch, L, G, N).
        C: (batch, L, G, N), unused.
        D: Optional (H,), unused.
        chunk_size: Tokens per chunk Q.
        *args: Ignored.
        **kwargs: Ignored.

    Returns:
        ``batch * (2 G Lp Q N + 2 H Lp (Q + N) P + 2 H Lp N P)``.
    """
    batch, length, heads, headdim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    q = int(chunk_size)
    padded = math.ceil(length / q) * q
    return batch * (2 * groups * padded * q * d_state + 2 * heads * padded * (q + d_state) *
                    headdim + 2 * heads * padded * d_state * headdim)


def _triton_function(module_name: str, class_name: str) -> Optional[type]:
    """An autograd Function of a Triton kernel module, when its kernel path can run.

    The module is imported only when triton is installed and the kernels can actually be
    launched (CUDA available, or ``TRITON_INTERPRET=1``), or when it was imported already;
    otherwise the PyTorch path runs and there is nothing to register.

    Args:
        module_name: Dotted name of the kernel module.
        class_name: Name of the Function class in it.

    Returns:
        The Function class, or ``None``.
    """
    module = sys.modules.get(module_name)
    if module is None:
        usable = triton_available() and (torch.cuda.is_available()
                                         or triton_interpreter_enabled())
        if not usable:
            return None
        module = importlib.import_module(module_name)
    return getattr(module, class_name)


def triton_linear_attention_function() -> Optional[type]:
    """The Triton linear-attention autograd Function, when its kernel path can run (see
    :func:`_triton_function`), else ``None``."""
    return _triton_function(TRITON_LINEAR_ATTENTION_MODULE, '_FusedLinearAttention')


def triton_ssd_scan_function() -> Optional[type]:
    """The Triton SSD-scan autograd Function, when its kernel path can run (see
    :func:`_triton_function`), else ``None``."""
    return _triton_function(TRITON_SSD_SCAN_MODULE, '_SSDScanTriton')


def default_function_formulas() -> Dict[type, FunctionFlopFormula]:
    """Formulas of this package's custom autograd Functions (see
    :func:`triton_linear_attention_function` and :func:`triton_ssd_scan_function`)."""
    formulas: Dict[type, FunctionFlopFormula] = {}
    for function, formula in ((triton_linear_attention_function(),
                               linear_attention_function_flops),
                              (triton_ssd_scan_function(), ssd_scan_function_flops)):
        if function is not None:
            formulas[function] = formula
    return formulas


# ---------------------------------------------------------------------------------- counter
@dataclass
class FlopCount:
    """Result of a count.

    Attributes:
        total: FLOPs (2 x MACs).
        by_op: FLOPs per aten op / autograd Function name.
    """
    total: int
    by_op: Dict[str, int] = field(default_factory=dict)

    @property
    def gflops(self) -> float:
        """Total in GFLOPs (1e9)."""
        return self.total / 1e9


class FlopCounter:
    """Context manager counting the FLOPs of everything run inside it (see module docstring).

    Example::

        with FlopCounter() as counter:
            model(images)
        print(counter.total, counter.by_op)

    Args:
        function_formulas: Extra ``{autograd.Function subclass: formula}``; a formula gets the
            arguments of ``Function.apply`` and returns FLOPs.  Merged over the defaults.
        op_formulas: Extra ``{aten op (overload packet): formula}`` in FlopCounterMode's
            convention (tensor arguments arrive as shapes, ``out_shape`` keyword).
        use_default_functions: Register :func:`default_function_formulas` too.
        ssd_chunk_form: Count the PyTorch SSD scan at its configured ``chunk_size``: inside
            the counter ``mmlinvit.ops.ssd.torch_impl.INFERENCE_FORM`` is ``False`` (restored
            on exit), so scans without gradients run the chunked form (the algorithm of
            training and of the Triton kernel) instead of the CPU inference form in chunks
            of at most ``INFERENCE_CHUNK`` tokens.  ``False`` counts whatever form runs.
    """

    def __init__(self,
                 function_formulas: Optional[Mapping[type, FunctionFlopFormula]] = None,
                 op_formulas: Optional[Mapping[Any, Callable[..., int]]] = None,
                 use_default_functions: bool = True,
                 ssd_chunk_form: bool = True) -> None:
        for cls in (function_formulas or {}):
            if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
                raise TypeError(f'function_formulas keys must be torch.autograd.Function '
                                f'subclasses, got {cls!r}')
        self._extra_functions = dict(function_formulas or {})
        self._op_formulas = {op: _sdpa_op_formula for op in extra_sdpa_ops()}
        self._op_formulas.update(_conv_ops())
        self._op_formulas.update({op: _sdpa_backward_op_formula
                                  for op in extra_sdpa_backward_ops()})
        self._op_formulas.update(op_formulas or {})
        self._use_default_functions = use_default_functions
        self._ssd_chunk_form = ssd_chunk_form
        self._saved_inference_form: Optional[bool] = None
        self._mode: Optional[FlopCounterMode] = None
        self._function_flops: Dict[str, int] = defaultdict(int)
        self._discarded_inner_flops = 0
        self._saved_apply: Dict[type, Tuple[bool, Any, bool, Any]] = {}
        self._last: Optional[FlopCount] = None

    # ------------------------------------------------------------------ function wrapping
    def _wrap_function(self, cls: type, formula: FunctionFlopFormula) -> None:
        """Counts ``cls``'s forward by ``formula`` and its backward as twice that.

        Every matmul's backward is two matmuls of its size (the gradients of both operands),
        which is what the PyTorch path of these Functions is counted when it is
        differentiated; the FLOPs are put on the Function's autograd node and added when the
        backward runs inside the counter.
        """
        self._saved_apply[cls] = ('apply' in cls.__dict__, cls.__dict__.get('apply'),
                                  'backward' in cls.__dict__, cls.__dict__.get('backward'))
        original_apply = cls.apply  # bound classmethod
        original_backward = cls.backward
        counter = self

        def counted_apply(*args: Any, **kwargs: Any) -> Any:
            mode = counter._mode
            before = mode.get_total_flops()
            out = original_apply(*args, **kwargs)
            counter._discarded_inner_flops += mode.get_total_flops() - before
            flops = int(formula(*args, **kwargs))
            counter._function_flops[cls.__name__] += flops
            first = out[0] if isinstance(out, (tuple, list)) else out
            node = getattr(first, 'grad_fn', None)
            if node is not None:
                node._mmlinvit_backward_flops = 2 * flops
            return out

        def counted_backward(ctx: Any, *grads: Any) -> Any:
            mode = counter._mode
            before = mode.get_total_flops()
            result = original_backward(ctx, *grads)
            counter._discarded_inner_flops += mode.get_total_flops() - before
            counter._function_flops[f'{cls.__name__}.backward'] += getattr(
                ctx, '_mmlinvit_backward_flops', 0)
            return result

        cls.apply = staticmethod(counted_apply)
        cls.backward = staticmethod(counted_backward)

    def _restore_functions(self) -> None:
        for cls, (own_apply, apply, own_backward, backward) in self._saved_apply.items():
            for name, own, original in (('apply', own_apply, apply),
                                        ('backward', own_backward, backward)):
                if own:
                    setattr(cls, name, original)
                else:
                    delattr(cls, name)
        self._saved_apply.clear()

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> 'FlopCounter':
        if self._mode is not None:
            raise RuntimeError('FlopCounter is not reentrant; use a new instance')
        self._function_flops.clear()
        self._discarded_inner_flops = 0
        self._last = None
        functions = default_function_formulas() if self._use_default_functions else {}
        functions.update(self._extra_functions)
        self._mode = FlopCounterMode(display=False, custom_mapping=self._op_formulas)
        for cls, formula in functions.items():
            self._wrap_function(cls, formula)
        if self._ssd_chunk_form:
            self._saved_inference_form = ssd_torch_impl.INFERENCE_FORM
            ssd_torch_impl.INFERENCE_FORM = False
        self._mode.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self._mode.__exit__(*exc_info)
        finally:
            if self._saved_inference_form is not None:
                ssd_torch_impl.INFERENCE_FORM = self._saved_inference_form
                self._saved_inference_form = None
            self._restore_functions()
            self._last = self._snapshot()
            self._mode = None

    # ------------------------------------------------------------------ results
    def _snapshot(self) -> FlopCount:
        aten_counts = self._mode.get_flop_counts().get('Global', {})
        by_op = {str(op): int(v) for op, v in aten_counts.items() if v}
        if self._discarded_inner_flops:
            by_op['discarded_inside_functions'] = -self._discarded_inner_flops
        for name, v in self._function_flops.items():
            by_op[name] = by_op.get(name, 0) + v
        return FlopCount(total=sum(by_op.values()), by_op=by_op)

    def result(self) -> FlopCount:
        """The count so far (inside the context) or of the finished context."""
        if self._mode is not None:
            return self._snapshot()
        if self._last is None:
            raise RuntimeError('FlopCounter.result() called before the counter was used')
        return self._last

    @property
    def total(self) -> int:
        """Total FLOPs (2 x MACs)."""
        return self.result().total

    @property
    def by_op(self) -> Dict[str, int]:
        """FLOPs per aten op / Function name."""
        return dict(self.result().by_op)


def count_flops(model: nn.Module,
                *inputs: Any,
                function_formulas: Optional[Mapping[type, FunctionFlopFormula]] = None,
                **kwargs: Any) -> FlopCount:
    """FLOPs of one ``model(*inputs, **kwargs)`` forward under ``torch.no_grad``.

    Inputs (and the model) may live on ``torch.device('meta')``: only shapes are needed, except
    for models with data-dependent shapes (e.g. ``torch.nonzero`` in MHLA).

    Args:
        model: Any module.
        *inputs: Positional forward inputs.
        function_formulas: Extra autograd Function formulas (see :class:`FlopCounter`).
        **kwargs: Keyword forward inputs.

    Returns:
        The :class:`FlopCount`.
    """
    with torch.no_grad(), FlopCounter(function_formulas=function_formulas) as counter:
        model(*inputs, **kwargs)
    return counter.result()


# ---------------------------------------------------------------------------------- analytic
@dataclass(frozen=True)
class AnalyticFlops:
    """Closed-form FLOPs (2 x MACs) of a ViT forward, batch 1.

    Attributes:
        num_tokens: Sequence length N (prefix tokens included).
        gemms: qkv, proj and MLP of all layers (24 N D^2 per layer for M_h = 4 D).
        attention: Token mixing of all layers (4 N^2 D softmax, 4 N d D linear per layer).
        extras: Patch embedding and the linear-attention normaliser (0 unless ``exact``).
    """
    num_tokens: int
    gemms: int
    attention: int
    extras: int

    @property
    def reference_total(self) -> int:
        """GEMMs + attention: the convention of the issue (24 N D^2 + 4 N^2 D / 4 N d D)."""
        return self.gemms + self.attention

    @property
    def total(self) -> int:
        """Everything :class:`FlopCounter` counts in a VisionTransformer forward."""
        return self.gemms + self.attention + self.extras


def block_gemm_flops(num_tokens: int, embed_dims: int, mlp_hidden_dims: int) -> int:
    """qkv (2 N D 3D) + proj (2 N D^2) + MLP (2 x 2 N D M_h) of one block."""
    n, d_model = num_tokens, embed_dims
    return 8 * n * d_model * d_model + 4 * n * d_model * mlp_hidden_dims


def attention_flops(operator: str, num_tokens: int, embed_dims: int, num_heads: int,
                    exact: bool = True) -> int:
    """Token-mixing FLOPs of one layer.

    Args:
        operator: One of :data:`ANALYTIC_OPERATORS`.
        num_tokens: N.
        embed_dims: D.
        num_heads: H (head width d = D / H).
        exact: Add the kernel linear attention's normaliser mat-vec (2 N D), as counted.

    Returns:
        4 N^2 D (softmax), 4 N d D (+ 2 N D) (kernel linear attention) or 4 N d D (InLine).
    """
    if operator not in ANALYTIC_OPERATORS:
        raise KeyError(f'No closed-form FLOP count for operator {operator!r}; available: '
                       f'{list(ANALYTIC_OPERATORS)} (count the model with count_flops instead)')
    n, d_model = num_tokens, embed_dims
    if operator == 'softmax':
        return 4 * n * n * d_model
    head_dims = embed_dims // num_heads
    normaliser = 2 * n * d_model if exact and operator != 'inline' else 0
    return 4 * n * head_dims * d_model + normaliser


def analytic_vit_flops(img_size: Union[int, Tuple[int, int]],
                       patch_size: int,
                       embed_dims: int,
                       num_layers: int,
                       num_heads: int,
                       mlp_hidden_dims: int,
                       attention: Union[str, Mapping[str, Any], Sequence[Union[str, Mapping]]],
                       num_prefix_tokens: int = 1,
                       in_channels: int = 3,
                       exact: bool = True) -> AnalyticFlops:
    """Closed-form FLOPs of a plain ViT forward (batch 1, MLP blocks).

    Args:
        img_size: Input side or (H, W).
        patch_size: Patch side p.
        embed_dims: D.
        num_layers: Depth.
        num_heads: H.
        mlp_hidden_dims: M_h.
        attention: Operator name / config, or one per layer (hybrid stacks).
        num_prefix_tokens: Class + register tokens.
        in_channels: Image channels c.
        exact: Include the patch embedding and the normaliser (``extras``); with ``False``
            only the issue's convention (GEMMs + attention) remains.

    Returns:
        :class:`AnalyticFlops`.
    """
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    num_patches = (-(-h // patch_size)) * (-(-w // patch_size))  # corner-padded grid
    n = num_patches + num_prefix_tokens
    if isinstance(attention, (str, Mapping)):
        ops = [operator_name(attention)] * num_layers
    else:
        if len(attention) != num_layers:
            raise ValueError(f'attention has {len(attention)} entries for {num_layers} layers')
        ops = [operator_name(a) for a in attention]
    gemms = num_layers * block_gemm_flops(n, embed_dims, mlp_hidden_dims)
    mixing = sum(attention_flops(op, n, embed_dims, num_heads, exact=False) for op in ops)
    extras = 0
    if exact:
        extras += 2 * num_patches * in_channels * patch_size * patch_size * embed_dims
        extras += sum(2 * n * embed_dims for op in ops
                      if op in _LINEAR_ANALYTIC_OPERATORS and op != 'inline')
    return AnalyticFlops(num_tokens=n, gemms=gemms, attention=mixing, extras=extras)
