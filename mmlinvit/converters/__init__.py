"""Checkpoint reading and converters: official layouts -> the backbones' canonical layouts.

Layouts: ``dinov2`` (facebookresearch hub), ``timm`` (also DeiT / DeiT-III / MAE releases),
``openai_clip``, ``mmpretrain`` (into the ViT layout) and ``adventurer`` (the public Adventurer
code); ``'auto'`` detects them.  One prefix table (:data:`BACKBONE_PREFIXES`) finds the
backbone inside task-model and distillation checkpoints.  :func:`load_pretrained` reads
safely, converts and loads all-or-nothing, after comparing every key and shape; it is what
every backbone's ``pretrained`` goes through.
"""
from .layouts import (BACKBONE_PREFIXES, CHECKPOINT_LAYOUTS, STUDENT_PREFIXES,
                      convert_adventurer, convert_dinov2, convert_mmpretrain,
                      convert_openai_clip, convert_timm, detect_layout, layout_names,
                      select_backbone)
from .loading import (CheckpointMismatchError, UntrustedCheckpointError, check_state_dict_fits,
                      convert_state_dict, load_checkpoint_file, load_pretrained,
                      read_checkpoint)
from .report import ConversionReport

__all__ = [
    'BACKBONE_PREFIXES', 'CHECKPOINT_LAYOUTS', 'CheckpointMismatchError', 'ConversionReport',
    'STUDENT_PREFIXES', 'UntrustedCheckpointError', 'check_state_dict_fits',
    'convert_adventurer', 'convert_dinov2', 'convert_mmpretrain', 'convert_openai_clip',
    'convert_state_dict', 'convert_timm', 'detect_layout', 'layout_names',
    'load_checkpoint_file', 'load_pretrained', 'read_checkpoint', 'select_backbone'
]
