"""Checkpoint converters: official layouts -> mmlinvit's canonical ViT layout (torch only).

Layouts: ``dinov2`` (facebookresearch hub), ``timm`` (also DeiT / DeiT-III / MAE releases),
``openai_clip``, ``mmpretrain``; ``'auto'`` detects them.  :func:`load_pretrained` converts
and loads all-or-nothing, after comparing every key and shape.
"""
from .layouts import (CHECKPOINT_LAYOUTS, convert_dinov2, convert_mmpretrain,
                      convert_openai_clip, convert_timm, detect_layout, layout_names,
                      select_backbone)
from .loading import (CheckpointMismatchError, UntrustedCheckpointError, check_state_dict_fits,
                      convert_state_dict, load_checkpoint_file, load_pretrained)
from .report import ConversionReport

__all__ = [
    'CHECKPOINT_LAYOUTS', 'CheckpointMismatchError', 'ConversionReport',
    'UntrustedCheckpointError', 'check_state_dict_fits', 'convert_dinov2',
    'convert_mmpretrain', 'convert_openai_clip', 'convert_state_dict', 'convert_timm',
    'detect_layout', 'layout_names', 'load_checkpoint_file', 'load_pretrained',
    'select_backbone'
]
