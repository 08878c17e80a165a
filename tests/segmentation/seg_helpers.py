"""Helpers of the segmentation tests: a shrinker that keeps a real config's structure
(pipelines, heads, schedules, constructors) while making every size tiny enough for a CPU step."""
import copy
import os
import os.path as osp
from typing import Optional, Tuple

import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY_ARCH = dict(embed_dims=32, num_layers=4, num_heads=2, mlp_hidden_dims=64)


def config_path(rel: str) -> str:
    """Absolute path of a config under configs/."""
    return osp.join(REPO, 'configs', rel)


def _scale_pair(value, factor: float):
    return tuple(max(1, int(round(v * factor))) for v in value)


def _shrink_pipeline(pipeline, factor: float, crop: Tuple[int, int]) -> None:
    for t in pipeline:
        if 'scale' in t:
            t['scale'] = _scale_pair(t['scale'], factor)
        if 'crop_size' in t:
            t['crop_size'] = crop


def _save_tiny_backbone(cfg: dict, path: str, prefix: str) -> None:
    """Writes the weights of a freshly built backbone (like a Stage-2 / teacher checkpoint)."""
    from mmlinvit.registry import MODELS
    cfg = copy.deepcopy(cfg)
    cfg['pretrained'] = None
    backbone = MODELS.build(cfg)
    torch.save({prefix + k: v for k, v in backbone.state_dict().items()}, path)


def _shrink_backbone(backbone: dict, crop: Tuple[int, int], ckpt_dir: str, name: str,
                     prefix: str) -> None:
    backbone['arch'] = dict(TINY_ARCH)
    backbone['img_size'] = crop[0]
    backbone['drop_path_rate'] = 0.0
    if 'out_indices' in backbone:
        backbone['out_indices'] = [0, 1, 2, 3]
    if backbone.get('pretrained'):
        path = osp.join(ckpt_dir, f'{name}.pth')
        _save_tiny_backbone(backbone, path, prefix)
        backbone['pretrained'] = path


def _shrink_seg_model(model: dict, crop: Tuple[int, int], factor: float, ckpt_dir: str) -> None:
    dims = TINY_ARCH['embed_dims']
    _shrink_backbone(model['backbone'], crop, ckpt_dir, 'student_backbone', 'student.')
    model['neck']['embed_dim'] = dims
    pre = model['data_preprocessor']
    if pre.get('size') is not None:
        pre['size'] = crop
    head = model['decode_head']
    head['in_channels'] = [dims] * 4
    if head['type'] == 'Mask2FormerHead':
        head.update(feat_channels=32, out_channels=32, num_queries=8)
        enc = head['pixel_decoder']['encoder']
        enc['num_layers'] = 1
        enc['layer_cfg']['self_attn_cfg'].update(embed_dims=32, num_heads=2)
        enc['layer_cfg']['ffn_cfg'].update(embed_dims=32, feedforward_channels=64)
        head['pixel_decoder']['norm_cfg'] = dict(type='GN', num_groups=8)
        head['pixel_decoder']['positional_encoding'] = dict(num_feats=16, normalize=True)
        head['positional_encoding'] = dict(num_feats=16, normalize=True)
        dec = head['transformer_decoder']
        dec['num_layers'] = 3
        for key in ('self_attn_cfg', 'cross_attn_cfg'):
            dec['layer_cfg'][key].update(embed_dims=32, num_heads=2)
        dec['layer_cfg']['ffn_cfg'].update(embed_dims=32, feedforward_channels=64)
        head['train_cfg']['num_points'] = 64
    else:
        head['channels'] = 32
    aux = model.get('auxiliary_head')
    if aux:
        aux.update(in_channels=dims, channels=16)
    test_cfg = model.get('test_cfg') or {}
    for key in ('crop_size', 'stride'):
        if key in test_cfg:
            test_cfg[key] = _scale_pair(test_cfg[key], factor)


def tiny_config(rel: str, data_root: str, work_dir: str, cfg_options: Optional[dict] = None):
    """Loads configs/<rel> and shrinks it: width-32, 4-block backbone at 4 x 4 patches,
    small heads, all pipeline sizes scaled, generated data, one train iteration.

    Checkpoints the config names (Stage-2 student, teacher) are replaced by freshly written
    tiny ones, so the loading path runs too.
    """
    from mmengine.config import Config
    cfg = Config.fromfile(config_path(rel), format_python_code=False)  # skip yapf: faster
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    ckpt_dir = osp.join(work_dir, 'ckpts')
    os.makedirs(ckpt_dir, exist_ok=True)
    distill = cfg.model['type'] == 'mmlinvit.DistillationModel'
    seg = cfg.model['student'] if distill else cfg.model
    patch = seg['backbone'].get('patch_size') or (14 if seg['backbone']['family'] == 'dinov2'
                                                   else 16)
    crop_cfg = cfg.train_dataloader.dataset.pipeline
    orig_crop = next(t['crop_size'] for t in crop_cfg if 'crop_size' in t)
    factor = 4 * patch / orig_crop[0]
    crop = _scale_pair(orig_crop, factor)
    _shrink_seg_model(seg, crop, factor, ckpt_dir)
    if distill:
        teacher = cfg.model['teacher']
        _shrink_backbone(teacher, crop, ckpt_dir, 'teacher', '')
        cfg.model['check_input_size'] = crop
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dl = cfg[loader]
        dl.update(batch_size=2, num_workers=0, persistent_workers=False)
        dl.dataset['data_root'] = data_root
        _shrink_pipeline(dl.dataset.pipeline, factor, crop)
    cfg.work_dir = work_dir
    cfg.train_cfg.update(max_iters=1, val_interval=1)
    cfg.default_hooks.logger['interval'] = 1
    cfg.default_hooks.checkpoint.update(interval=1000, save_best=None)  # tests opt in
    cfg.env_cfg['mp_cfg'] = dict(mp_start_method='fork', opencv_num_threads=1)
    cfg.log_level = 'WARNING'
    return cfg
