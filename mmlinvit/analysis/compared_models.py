"""The model pairs the backbone tools compare: a ViT and the Adventurer of its size (torch only).

``tools/analysis/benchmark_backbones.py`` and ``tools/analysis/visualize_attention.py`` both
put a ViT (softmax teacher and linear students) next to the Mamba-2 Adventurer of the same
width; :data:`COMPARED_MODELS` names those pairs once; :data:`SMOKE_MODEL` is the benchmarks'
tiny pair for smoke runs.
"""
from dataclasses import dataclass
from typing import Optional, Union

import torch.nn as nn

from mmlinvit.backbones import VIT_FAMILIES, VIT_SIZES, VisionTransformer


@dataclass(frozen=True)
class ComparedModel:
    """One ViT / Adventurer pair.

    Attributes:
        label: Printed name, e.g. ``'ViT-B/16'``.
        vit_arch: ViT size name (``'b'``, ``'l'``...) or a dict with ``embed_dims``,
            ``num_layers``, ``num_heads`` and ``mlp_hidden_dims``.
        family: ViT family (its patch size, position embedding and prefix tokens).
        adventurer_arch: Adventurer size name or dict (``embed_dims``, ``num_layers``).
        adventurer_mixer: Mamba-2 mixer options of the Adventurer (``None``: its defaults).
    """
    label: str
    vit_arch: Union[str, dict]
    family: str
    adventurer_arch: Union[str, dict]
    adventurer_mixer: Optional[dict] = None

    @property
    def patch_size(self) -> int:
        """The ViT family's patch size."""
        return VIT_FAMILIES[self.family]['patch_size']

    @property
    def vit_dims(self) -> dict:
        """The ViT's ``embed_dims``, ``num_layers``, ``num_heads`` and ``mlp_hidden_dims``."""
        return dict(VIT_SIZES[self.vit_arch] if isinstance(self.vit_arch, str) else
                    self.vit_arch)

    def build_vit(self, attn_cfg: Union[str, dict, list], **kwargs) -> VisionTransformer:
        """The ViT with attention operator(s) ``attn_cfg`` (random weights unless ``kwargs``
        name ``pretrained``)."""
        return VisionTransformer(self.vit_arch, family=self.family, attn_cfg=attn_cfg, **kwargs)

    def build_adventurer(self, patch_size: Optional[int] = None, **kwargs) -> nn.Module:
        """The Adventurer of the pair (``patch_size``: ``None`` for its default).

        ``mmlinvit.backbones.adventurer`` is imported here, when an Adventurer is asked for.
        """
        from mmlinvit.backbones.adventurer import Adventurer
        return Adventurer(self.adventurer_arch, patch_size=patch_size,
                          mixer_cfg=self.adventurer_mixer, **kwargs)


#: ViT-B/16 (DeiT) and ViT-L/14 (DINOv2), each with the Adventurer of its width.
COMPARED_MODELS = {
    'vit-b16': ComparedModel('ViT-B/16', 'b', 'deit', 'b'),
    'vit-l14': ComparedModel('ViT-L/14', 'l', 'dinov2', 'l'),
}

#: A 2-layer, 64-wide pair for smoke runs of the benchmark tools (``--tiny`` / ``--model tiny``).
SMOKE_MODEL = ComparedModel(
    'tiny/16', dict(embed_dims=64, num_layers=2, num_heads=4, mlp_hidden_dims=256), 'deit',
    dict(embed_dims=64, num_layers=2), adventurer_mixer=dict(d_state=16, headdim=32))
