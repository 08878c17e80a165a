"""Recorders: forward hooks that capture module inputs, outputs or attention maps by path.

Torch only.  A recorder is given a module path relative to a model (``'blocks.3.attn'``, or
``'backbone.blocks.3.attn'`` for a task model).  A path holding ``{i}`` is a template expanded
over block indices: ``indices=None`` records every block (the modules the path up to ``{i}``
names; a block without the module is an error naming the indices that have it), a list
records those indices (negative ones count from the last block).  A template recorder yields
a list of tensors (one per index, in order); a plain one yields a tensor.  Hooks only record while
the recorder is enabled, so plain inference through the same modules stores nothing.

In a plain PyTorch loop use a recorder as a context manager: it records while the ``with``
block runs, forgets the previous records whenever the model it is attached to starts a
forward, and removes its hooks on exit::

    with ModuleOutputsRecorder('blocks.{i}.attn').attach(student) as rec:
        student(images)
        outputs = rec.get()  # one (B, N, C) tensor per block

:class:`~mmlinvit.models.distill.DistillationModel` (the mmengine integration) drives the
same classes itself: it attaches them, enables them around its forward passes and resets
them after each step.
"""
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn

from mmlinvit.utils import NameRegistry
from .errors import DistillationConfigError

#: Recorder types by config name.
RECORDERS = NameRegistry('recorder')

Record = Union[torch.Tensor, List[torch.Tensor]]


def module_exists(model: nn.Module, path: str) -> bool:
    """Whether ``model.get_submodule(path)`` succeeds."""
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def describe_missing_module(model: nn.Module, path: str) -> str:
    """Names the deepest existing parent of ``path`` and its children, for error messages."""
    parts = path.split('.')
    parent_path = ''
    for depth in range(len(parts)):
        candidate = '.'.join(parts[:depth + 1])
        if not module_exists(model, candidate):
            break
        parent_path = candidate
    parent = model.get_submodule(parent_path)
    children = [name for name, _ in parent.named_children()][:24]
    where = repr(parent_path) if parent_path else 'the model root'
    return f'{where} ({type(parent).__name__}) has children {children}'


class ModuleRecorder:
    """Base recorder: resolves paths, owns hooks, stores one tensor per resolved module.

    Args:
        source: Module path, optionally with an ``{i}`` template.
        indices: Template indices (``None``: all existing); only with ``{i}``.
    """

    def __init__(self, source: str, indices: Optional[Sequence[int]] = None) -> None:
        if not isinstance(source, str) or not source:
            raise DistillationConfigError(f'A recorder source must be a module path, got '
                                          f'{source!r}')
        if indices is not None and '{i}' not in source:
            raise DistillationConfigError(f'Recorder source {source!r} has no {{i}} template, '
                                          f'so it takes no indices (got {list(indices)})')
        if indices is not None and not list(indices):
            raise DistillationConfigError(f'Recorder source {source!r}: indices is empty; give '
                                          f'the block indices to record, or None for all')
        self.source = source
        self.requested_indices = None if indices is None else [int(i) for i in indices]
        self.indices: List[int] = []
        self.paths: List[str] = []
        self.enabled = False
        self.where = f'recorder {source!r}'
        self._records: Dict[int, Any] = {}
        self._handles: List[Any] = []
        self._model: Optional[nn.Module] = None
        self._reset_handle: Optional[Any] = None

    @property
    def is_template(self) -> bool:
        """Whether the recorder yields one record per index."""
        return '{i}' in self.source

    def resolve(self, model: nn.Module, where: str) -> List[str]:
        """Expands the source into module paths that exist in ``model``.

        Args:
            model: The student or teacher model.
            where: Description for messages (e.g. ``"student recorder 'attn_out'"``).

        Raises:
            DistillationConfigError: naming the missing module and the existing children.
        """
        if not self.is_template:
            if not module_exists(model, self.source):
                raise DistillationConfigError(
                    f'{where}: module {self.source!r} does not exist in '
                    f'{type(model).__name__}; {describe_missing_module(model, self.source)}')
            self.indices, self.paths = [0], [self.source]
            return self.paths
        parts = self.source.split('.')
        slot = next(k for k, part in enumerate(parts) if '{i}' in part)
        container = '.'.join(parts[:slot + 1])  # 'blocks.{i}' of 'blocks.{i}.attn'
        depth = 0
        while module_exists(model, container.format(i=depth)):
            depth += 1
        present = [i for i in range(depth) if module_exists(model, self.source.format(i=i))]
        if not present:
            first = self.source.format(i=0)
            raise DistillationConfigError(
                f'{where}: no module matches {self.source!r} in {type(model).__name__} '
                f'(first missing: {first!r}); {describe_missing_module(model, first)}')
        exists = (f'indices 0..{depth - 1}' if len(present) == depth
                  else f'indices {present} of the {depth} {container!r}')
        if self.requested_indices is None:
            if len(present) != depth:  # records pair by position: a gap would shift them
                missing = sorted(set(range(depth)) - set(present))
                raise DistillationConfigError(
                    f'{where}: {self.source!r} exists for {exists}, not for {missing}; give '
                    f'indices={present} to record those')
            indices = present
        else:
            indices = []
            for idx in self.requested_indices:
                real = idx + depth if idx < 0 else idx
                if real not in present:
                    raise DistillationConfigError(
                        f'{where}: index {idx} is out of range; {self.source!r} exists for '
                        f'{exists}')
                indices.append(real)
        self.indices = indices
        self.paths = [self.source.format(i=i) for i in indices]
        return self.paths

    def attach(self, model: nn.Module, where: Optional[str] = None) -> 'ModuleRecorder':
        """Resolves the paths and registers one hook per module.

        Args:
            model: The model whose submodules are recorded.
            where: Description for messages (default: ``"recorder '<source>'"``).

        Returns:
            The recorder itself, so that ``with Recorder(...).attach(model) as rec:`` works.
        """
        self.detach()
        if where is not None:
            self.where = where
        self.resolve(model, self.where)
        try:
            for slot, path in enumerate(self.paths):
                module = model.get_submodule(path)
                self.check_module(module, path, self.where)
                self._handles.append(self._register(module, self._make_store(slot)))
        except Exception:
            self.detach()  # no half-attached recorder
            raise
        self._model = model
        return self

    def detach(self) -> None:
        """Removes the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._reset_handle is not None:
            self._reset_handle.remove()
            self._reset_handle = None
        self._model = None

    def __enter__(self) -> 'ModuleRecorder':
        """Starts recording; every forward of the attached model first forgets old records."""
        if self._model is None:
            raise RuntimeError(f'{self.where} is not attached to a model; use '
                               f'`with {type(self).__name__}(...).attach(model) as rec:`')
        self.reset()
        self.enabled = True
        # prepend: runs before any recording pre-hook on the root module itself.
        self._reset_handle = self._model.register_forward_pre_hook(
            lambda module, args: self.reset(), prepend=True)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """Stops recording, forgets the records and removes the hooks."""
        self.enabled = False
        self.reset()
        self.detach()

    def check_module(self, module: nn.Module, path: str, where: str) -> None:
        """Raises if the module cannot be recorded this way (subclasses)."""

    def _make_store(self, slot: int) -> Callable[[Any], None]:

        def store(value: Any) -> None:
            if self.enabled:
                self._records[slot] = value

        return store

    def _register(self, module: nn.Module, store: Callable[[Any], None]) -> Any:
        raise NotImplementedError

    def reset(self) -> None:
        """Forgets the stored records."""
        self._records = {}

    def get(self, where: Optional[str] = None) -> Record:
        """The record: a tensor, or a list (template recorders).

        Args:
            where: Description for messages (default: the one given to :meth:`attach`).

        Raises:
            RuntimeError: when a recorded module did not run in the last forward.
        """
        where = self.where if where is None else where
        if not self.paths:
            raise RuntimeError(f'{where}: the recorder is not attached to a model (call '
                               f'attach(model) first)')
        missing = [self.paths[s] for s in range(len(self.paths)) if s not in self._records]
        if missing:
            raise RuntimeError(f'{where}: module(s) {missing} did not run during the forward '
                               f'pass, so nothing was recorded')
        values = [self._records[s] for s in range(len(self.paths))]
        return values if self.is_template else values[0]


@RECORDERS.register_module('ModuleOutputs')
class ModuleOutputsRecorder(ModuleRecorder):
    """Records module outputs (forward hook).

    Args:
        source: Module path, optionally with ``{i}``.
        indices: Template indices.
        output_index: Element to keep when the module returns a tuple/list.
    """

    def __init__(self, source: str, indices: Optional[Sequence[int]] = None,
                 output_index: Optional[int] = None) -> None:
        super().__init__(source, indices)
        self.output_index = output_index

    def _register(self, module: nn.Module, store: Callable[[Any], None]) -> Any:

        def hook(mod: nn.Module, args: tuple, output: Any) -> None:
            if not self.enabled:
                return
            if self.output_index is not None:
                if not isinstance(output, (tuple, list)):
                    raise RuntimeError(
                        f'ModuleOutputs recorder on {self.source!r}: output_index='
                        f'{self.output_index} selects an element of a tuple / list output, '
                        f'but the module returned a {type(output).__name__}')
                output = output[self.output_index]
            store(output)

        return module.register_forward_hook(hook)


@RECORDERS.register_module('ModuleInputs')
class ModuleInputsRecorder(ModuleRecorder):
    """Records a positional input of a module (forward pre-hook), e.g. a block's input.

    Args:
        source: Module path, optionally with ``{i}``.
        indices: Template indices.
        arg_index: Positional argument to record.
    """

    def __init__(self, source: str, indices: Optional[Sequence[int]] = None,
                 arg_index: int = 0) -> None:
        super().__init__(source, indices)
        self.arg_index = arg_index

    def _register(self, module: nn.Module, store: Callable[[Any], None]) -> Any:

        def hook(mod: nn.Module, args: tuple) -> None:
            if self.enabled:
                if len(args) <= self.arg_index:
                    raise RuntimeError(f'ModuleInputs recorder on {self.source!r}: the module '
                                       f'was called with {len(args)} positional arguments, '
                                       f'arg_index is {self.arg_index}')
                store(args[self.arg_index])

        return module.register_forward_pre_hook(hook)


@RECORDERS.register_module('AttentionMaps')
class AttentionMapsRecorder(ModuleRecorder):
    """Records (B, heads, N, N) maps of attention operators via their ``attention_map``.

    The operator's explicit map is evaluated on the inputs of its last forward (O(N^2) extra
    compute), so it suits small grids and analysis runs.  The hook only keeps the inputs; the
    map is computed when the record is read (:meth:`get`), outside the module's forward: a
    block under activation checkpointing (``with_cp``) recomputes its forward in the backward
    pass, which must save the tensors the first forward saved, and the recorders are off by
    then (computing the map inside the hook made that recomputation differ, a CheckpointError).
    """

    def check_module(self, module: nn.Module, path: str, where: str) -> None:
        if not callable(getattr(module, 'attention_map', None)) or not getattr(
                module, 'has_attention_map', True):
            raise DistillationConfigError(
                f'{where}: module {path!r} ({type(module).__name__}) has no explicit '
                f'attention map; match attention outputs (ModuleOutputs) instead')

    def _register(self, module: nn.Module, store: Callable[[Any], None]) -> Any:

        def hook(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if self.enabled:
                store(_PendingMap(mod, args, kwargs))

        return module.register_forward_hook(hook, with_kwargs=True)

    def get(self, where: Optional[str] = None) -> Record:
        """The maps of the last forward, computed on first read (see the class docstring)."""
        super().get(where)  # the checks: attached, every module ran
        for slot, value in list(self._records.items()):
            if isinstance(value, _PendingMap):
                self._records[slot] = value.compute()
        return super().get(where)


class _PendingMap:
    """An operator and the inputs of one forward, whose attention map is computed later."""

    def __init__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.module, self.args, self.kwargs = module, args, dict(kwargs)
        self.grad_enabled = torch.is_grad_enabled()  # that of the forward (no_grad teacher)

    def compute(self) -> Any:
        with torch.set_grad_enabled(self.grad_enabled):
            return self.module.attention_map(*self.args, **self.kwargs)


def build_recorder(cfg: Union[str, dict]) -> ModuleRecorder:
    """Builds a recorder from ``dict(type='ModuleOutputs', source=..., ...)``.

    A bare string is shorthand for ``dict(type='ModuleOutputs', source=<string>)``.
    """
    if isinstance(cfg, str):
        cfg = dict(type='ModuleOutputs', source=cfg)
    return RECORDERS.build(dict(cfg))
