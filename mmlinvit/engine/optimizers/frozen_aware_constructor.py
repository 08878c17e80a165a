"""mmengine's default optimizer-wrapper constructor, with frozen modules summarised in one line.

mmengine logs one WARNING per parameter with ``requires_grad=False`` ("... is skipped since its
requires_grad=False").  A distillation run freezes a whole teacher (and in ViT-AdaLA Stage 1
every non-attention part of the student): about 590 warnings at every DINOv2-L Stage-1 start,
which buried the run's real warnings.  Here a module whose parameters are all frozen is left
out as a whole and the run logs one INFO line naming the frozen parts; the parameter groups
are those of mmengine's constructor.
"""
import logging
import re
from collections import Counter
from typing import List, Optional

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper

from mmlinvit.registry import OPTIM_WRAPPER_CONSTRUCTORS


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class FrozenAwareOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``DefaultOptimWrapperConstructor`` (same arguments and groups) that reports frozen
    modules once instead of warning for each of their parameters.

    ``tools/train.py`` uses it for configs that name no constructor or mmengine's default.
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        self._frozen: Counter = Counter()
        wrapper = super().__call__(model)
        if self._frozen:
            parts = ', '.join(f'{prefix} ({count})' for prefix, count in
                              sorted(self._frozen.items()))
            print_log(f'Not optimised (requires_grad=False): {sum(self._frozen.values())} '
                      f'parameter tensors of {parts}', logger='current', level=logging.INFO)
        return wrapper

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module: Optional[int] = None) -> None:
        own = list(module.parameters())
        if own and not any(p.requires_grad for p in own):
            # blocks.0.mlp, blocks.1.mlp, ... -> blocks.*.mlp
            self._frozen[re.sub(r'\.\d+(?=\.|$)', '.*', prefix) or '<model>'] += len(own)
            return
        super().add_params(params, module, prefix=prefix, is_dcn_module=is_dcn_module)
