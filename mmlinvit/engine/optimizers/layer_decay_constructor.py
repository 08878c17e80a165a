"""Layer-wise learning-rate decay driven by the backbone's own ``get_layer_depth``.

mmseg's ``LayerDecayOptimizerConstructor`` picks the depth rule from the backbone's class name
(``'BEiT'``, ``'MAE'``, ``'ConvNeXt'``), so any other backbone silently gets no decay.  This
constructor instead asks the backbone: every module that implements
``get_layer_depth(param_name, prefix) -> (depth, num_depths)`` works, whatever its class.

Learning rate of a parameter at depth ``d`` (``0`` = embeddings, ``num_depths - 1`` = the last
depth, where necks and heads also live): ``base_lr * layer_decay_rate ** (num_depths - 1 - d)``.
"""
import logging
from typing import Dict, List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor

from mmlinvit.registry import OPTIM_WRAPPER_CONSTRUCTORS

from .param_groups import make_param_groups_plain

#: Parameter-name fragments exempt from weight decay (tokens and position embeddings).
DEFAULT_NO_DECAY_NAMES = ('pos_embed', 'cls_token', 'reg_token', 'mask_token')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Builds one parameter group per (depth, weight-decay) pair with a decayed learning rate.

    ``paramwise_cfg`` keys:

    - ``layer_decay_rate`` (float, required): multiplicative decay per depth step.
    - ``backbone`` (str, default ``'backbone'``): dotted attribute path of the module whose
      ``get_layer_depth`` assigns depths (``'student.backbone'`` inside a distillation model).
    - ``no_weight_decay_names`` (sequence of str): name fragments with weight decay 0
      (default :data:`DEFAULT_NO_DECAY_NAMES`); 1-D parameters (biases, norms, LayerScale)
      never get weight decay.
    - ``first_depth_names`` (sequence of str, default none): name fragments of parameters
      outside the backbone that take depth 0 (the embeddings' learning rate) instead of the
      last depth, e.g. Mask2Former's query / level embeddings, as ViT-Adapter's constructor
      places ``decode_head.{query_embed, query_feat, level_embed, cls_embed, mask_embed}``.

    Parameters outside the backbone (neck, head, distillation connectors) take the last depth,
    i.e. the full learning rate.  Frozen parameters (``requires_grad=False``: a distillation
    teacher, a linear probe's backbone) are left out of the optimizer, as mmpretrain's
    constructor does.

    Args:
        optim_wrapper_cfg: The ``optim_wrapper`` config (with ``optimizer``).
        paramwise_cfg: See above.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        paramwise_cfg = dict(paramwise_cfg or {})
        if 'layer_decay_rate' not in paramwise_cfg:
            raise KeyError('LayerDecayOptimWrapperConstructor needs paramwise_cfg.layer_decay_rate '
                           '(e.g. paramwise_cfg=dict(layer_decay_rate=0.9))')
        known = {'layer_decay_rate', 'backbone', 'no_weight_decay_names', 'first_depth_names'}
        unknown = set(paramwise_cfg) - known
        if unknown:
            raise KeyError(f'Unknown paramwise_cfg keys {sorted(unknown)} for '
                           f'LayerDecayOptimWrapperConstructor; supported: {sorted(known)}')
        self.layer_decay_rate = float(paramwise_cfg['layer_decay_rate'])
        if not 0.0 < self.layer_decay_rate <= 1.0:
            raise ValueError(f'layer_decay_rate must be in (0, 1], got {self.layer_decay_rate}')
        self.backbone_path = str(paramwise_cfg.get('backbone', 'backbone'))
        self.no_weight_decay_names: Tuple[str, ...] = tuple(
            paramwise_cfg.get('no_weight_decay_names', DEFAULT_NO_DECAY_NAMES))
        self.first_depth_names: Tuple[str, ...] = tuple(
            paramwise_cfg.get('first_depth_names', ()))
        # The parent only validates/stores; our keys are consumed above.
        super().__init__(optim_wrapper_cfg, paramwise_cfg=None)
        self.paramwise_cfg = paramwise_cfg

    def _find_backbone(self, model: nn.Module) -> nn.Module:
        module = model
        for attr in self.backbone_path.split('.'):
            if not hasattr(module, attr):
                raise AttributeError(
                    f'LayerDecayOptimWrapperConstructor: the model ({type(model).__name__}) has no '
                    f'{self.backbone_path!r}; set paramwise_cfg.backbone to the dotted path of the '
                    f'backbone (e.g. "student.backbone" for a distillation model)')
            module = getattr(module, attr)
        if not callable(getattr(module, 'get_layer_depth', None)):
            raise TypeError(f'{self.backbone_path!r} ({type(module).__name__}) has no '
                            f'get_layer_depth(param_name, prefix); layer-wise decay needs it')
        return module

    def layer_depths(self, model: nn.Module) -> Dict[str, Tuple[int, int]]:
        """Depth and number of depths of every named parameter of ``model``.

        Args:
            model: The model (unwrapped).

        Returns:
            ``{param_name: (depth, num_depths)}``.
        """
        backbone = self._find_backbone(model)
        prefix = self.backbone_path + '.'
        backbone_names = {prefix + n for n, _ in backbone.named_parameters()}
        _, num_depths = backbone.get_layer_depth(prefix + '__head__', prefix)
        depths = {}
        for name, _ in model.named_parameters():
            if name in backbone_names:
                depth, total = backbone.get_layer_depth(name, prefix)
                if total != num_depths or not 0 <= depth < total:
                    raise ValueError(f'get_layer_depth({name!r}) returned ({depth}, {total}); '
                                     f'expected 0 <= depth < {num_depths}')
                depths[name] = (depth, total)
            elif any(frag in name for frag in self.first_depth_names):
                depths[name] = (0, num_depths)
            else:
                depths[name] = (num_depths - 1, num_depths)
        unused = [frag for frag in self.first_depth_names
                  if not any(frag in name and name not in backbone_names for name in depths)]
        if unused:
            raise KeyError(f'paramwise_cfg.first_depth_names {unused} match no parameter '
                           f'outside {self.backbone_path!r}')
        return depths

    def _no_weight_decay(self, name: str, ndim: int) -> bool:
        return ndim == 1 or any(frag in name for frag in self.no_weight_decay_names)

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module=None) -> None:
        """Fills ``params`` with the depth-wise groups of ``module``.

        Args:
            params: The list of parameter groups to extend (the optimizer's first argument).
            module: The model.
            prefix: Unused (kept for the parent's signature).
            is_dcn_module: Unused (kept for the parent's signature).
        """
        depths = self.layer_depths(module)
        groups: Dict[str, dict] = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:  # frozen (a distillation teacher): as mmpretrain
                continue
            depth, total = depths[name]
            no_decay = self._no_weight_decay(name, param.ndim)
            key = f'layer_{depth}_{"no_decay" if no_decay else "decay"}'
            if key not in groups:
                scale = self.layer_decay_rate**(total - 1 - depth)
                groups[key] = dict(
                    params=[],
                    param_names=[],
                    group_name=key,
                    layer_depth=depth,
                    lr_scale=scale,
                    lr=self.base_lr * scale)
                if no_decay:
                    groups[key]['weight_decay'] = 0.0
                elif self.base_wd is not None:  # else the optimizer's default, as mmengine
                    groups[key]['weight_decay'] = self.base_wd
            groups[key]['params'].append(param)
            groups[key]['param_names'].append(name)
        ordered = sorted(groups.values(), key=lambda g: (g['layer_depth'], g['group_name']))
        params.extend(ordered)
        summary = ', '.join(f'{g["group_name"]}: {len(g["params"])} params x{g["lr_scale"]:.3g}'
                            for g in ordered)
        print_log(f'Layer-wise lr decay {self.layer_decay_rate} over {self.backbone_path}: '
                  f'{summary}', logger='current', level=logging.DEBUG)

    def __call__(self, model: nn.Module):
        """Builds the optimizer wrapper with the depth-wise parameter groups.

        Args:
            model: The model (a DDP wrapper is unwrapped).

        Returns:
            The ``OptimWrapper``.
        """
        if self.base_lr is None:
            raise KeyError('LayerDecayOptimWrapperConstructor needs optimizer.lr')
        # The parent uses the param-wise path only when paramwise_cfg is non-empty.
        return make_param_groups_plain(super().__call__(model))

