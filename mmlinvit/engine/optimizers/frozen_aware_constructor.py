"""mmengine's default optimizer-wrapper constructor, with frozen modules summarised in one line.

mmengine logs one WARNING per parameter with ``requires_grad=False`` ("... is skipped since its
requires_grad=False").  A distillation run freezes a whole teacher (and in ViT-AdaLA Stage 1
every non-attention part of the student): about 590 warnings at every DINOv2-L Stage-1 start,
which buried the run's real warnings.  Here a module whose parameters are all frozen is left
out as a whole, the frozen parameters of partly frozen modules (a Stage-1 student's
``cls_token`` / ``pos_embed``) are counted instead of warned about, and the run logs one INFO
line naming the frozen parts; the parameter groups are those of mmengine's constructor.
"""
import logging
import re
from collections import Counter
from typing import List, Optional

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper

from mmlinvit.registry import OPTIM_WRAPPER_CONSTRUCTORS

from ..log_filtering import current_logger_filter
from .param_groups import make_param_groups_plain


#: mmengine's warning for each parameter with requires_grad=False (``<name> is skipped ...``).
_SKIPPED = re.compile(r'^(\S+) is skipped since its requires_grad=False$')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class FrozenAwareOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` (same arguments and groups) that reports frozen
    modules once instead of warning for each of their parameters.

    ``tools/train.py`` uses it for configs that name no constructor or mmengine's default.
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        self._frozen: Counter = Counter()
        with current_logger_filter(self._count_if_skipped):
            wrapper = super().__call__(model)
        if self._frozen:
            parts = ', '.join(f'{prefix} ({count})' for prefix, count in
                              sorted(self._frozen.items()))
            print_log(f'Not optimised (requires_grad=False): {sum(self._frozen.values())} '
                      f'parameter tensors of {parts}', logger='current', level=logging.INFO)
        return make_param_groups_plain(wrapper)

    def _count_if_skipped(self, record: logging.LogRecord) -> bool:
        """Counts mmengine's per-parameter "is skipped" warning instead of showing it (the
        frozen parameters of partly frozen modules); other records pass."""
        found = _SKIPPED.match(record.getMessage())
        if found is None:
            return True
        self._frozen[_collapse_indices(found.group(1).lstrip('.'))] += 1
        return False

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module: Optional[int] = None) -> None:
        own = list(module.parameters())
        if own and not any(p.requires_grad for p in own):
            self._frozen[_collapse_indices(prefix) or '<model>'] += len(own)
            return
        super().add_params(params, module, prefix=prefix, is_dcn_module=is_dcn_module)


def _collapse_indices(name: str) -> str:
    """``blocks.0.mlp``, ``blocks.1.mlp``, ... -> ``blocks.*.mlp``."""
    return re.sub(r'\.\d+(?=\.|$)', '.*', name)
