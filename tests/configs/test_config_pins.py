"""Pins of the shipped recipes' EFFECTIVE values (after inheritance), against their names,
headers, the README's Deviations section and the reference notes (seed 000's recipe, the
ViT-Linearizer / ViT-AdaLA notes, mmseg MAE-B / BEiT-B UPerNet, ViT-Adapter-L Mask2Former).

Two layers:
* test_name_matches_effective_values: every config named
  {algo}_{backbone}_{G}xb{B}-{N}{k|e|it}_{dataset}-{H}x{W} trains B images per GPU, states
  auto_scale_lr.base_batch_size = G x B, runs N (x1000) iterations / epochs, ends its last
  scheduler there, and crops H x W.
* test_recipe_values: a table of dotted keys -> values for the numbers that decide a result
  (lr, decay, warm-up, schedule, drop-path, head / loss weights, crops, test windows,
  teacher checkpoints and statistics).  A deliberate change edits one table row.
Loads configs only (no build): ~0.2 s per config.
"""
import glob
import os.path as osp
import re

import pytest
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
ROOT = osp.join(REPO, 'configs')
CONFIGS = sorted(osp.relpath(p, ROOT) for p in glob.glob(osp.join(ROOT, '**', '*.py'),
                                                          recursive=True)
                 if '_base_' not in p)
NAME = re.compile(r'_(\d+)xb(\d+)-(\d+)(k|e|it)_([a-z0-9]+)-(\d+)x(\d+)$')
_CACHE = {}


def load(rel):
    if rel not in _CACHE:
        _CACHE[rel] = Config.fromfile(osp.join(ROOT, rel)).to_dict()
    return _CACHE[rel]


def get(cfg, dotted):
    """cfg['a']['b'][0]... for 'a.b.0'; 'pipe:train:RandomCrop.crop_size' picks a transform."""
    if dotted.startswith('pipe:'):
        _, which, rest = dotted.split(':', 2)
        step_type, key = rest.split('.', 1)
        pipeline = cfg[f'{which}_dataloader']['dataset']['pipeline']
        steps = [s for s in pipeline if s['type'] == step_type]
        assert len(steps) == 1, (which, step_type, pipeline)
        return get(steps[0], key)
    node = cfg
    for part in dotted.split('.'):
        node = node[int(part)] if isinstance(node, (list, tuple)) else node[part]
    return node


def norm(value):
    if isinstance(value, (list, tuple)):
        return [norm(v) for v in value]
    return value


@pytest.mark.parametrize('rel', [r for r in CONFIGS if NAME.search(osp.basename(r)[:-3])])
def test_name_matches_effective_values(rel):
    gpus, batch, length, unit, _, h, w = NAME.search(osp.basename(rel)[:-3]).groups()
    gpus, batch, h, w = int(gpus), int(batch), int(h), int(w)
    length = int(length) * (1000 if unit == 'k' else 1)
    cfg = load(rel)
    assert cfg['train_dataloader']['batch_size'] == batch
    assert cfg['auto_scale_lr']['base_batch_size'] == gpus * batch
    assert not cfg['auto_scale_lr'].get('enable', False)
    by_epoch = unit == 'e'
    loop = cfg['train_cfg']
    assert loop.get('max_epochs' if by_epoch else 'max_iters') == length
    ends = [s['end'] for s in cfg['param_scheduler'] if s.get('by_epoch', True) == by_epoch]
    assert max(ends) == length, cfg['param_scheduler']
    crops = [s.get('crop_size', s.get('scale')) for s in cfg['train_dataloader']['dataset']
             ['pipeline'] if s['type'] in ('RandomCrop', 'RandomResizedCrop')]
    assert len(crops) == 1
    crop = crops[0] if isinstance(crops[0], (list, tuple)) else (crops[0], crops[0])
    assert tuple(crop) == (h, w)


IMNET = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])
CLIP = dict(mean=[0.48145466 * 255, 0.4578275 * 255, 0.40821073 * 255],
            std=[0.26862954 * 255, 0.26130258 * 255, 0.27577711 * 255])
DEIT_B = 'checkpoints/deit_base_patch16_224-b5f2ef4d.pth'
DEIT_T = 'checkpoints/deit_tiny_patch16_224-a1311bcf.pth'
DINOV2_L = 'checkpoints/dinov2_vitl14_pretrain.pth'
STAGE2_OUT = ('work_dirs/vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_in22k-512x512/'
              'student_backbone.pth')
LINEARIZER_OUT = ('work_dirs/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224/'
                  'student_backbone.pth')

# seed 000: AdamW 2e-3 wd .05, 50 warm-up of 300 epochs, cosine to 1e-6, clip 3, LS .1
COPY_MLP = {
    'optim_wrapper.optimizer.type': 'AdamW', 'optim_wrapper.optimizer.lr': 2e-3,
    'optim_wrapper.optimizer.weight_decay': 0.05, 'optim_wrapper.clip_grad.max_norm': 3.0,
    'param_scheduler.0.end': 50, 'param_scheduler.1.begin': 50,
    'param_scheduler.1.type': 'CosineAnnealingLR', 'param_scheduler.1.eta_min': 1e-6,
    'model.student.head.loss.label_smooth_val': 0.1,
    'model.weight_transfer.type': 'mlp_copy',
}
COPY_MLP_IN = dict(COPY_MLP, **{
    'model.student.backbone.drop_path_rate': 0.1, 'model.student.head.num_classes': 1000,
    'model.teacher.pretrained': DEIT_B, 'data_preprocessor.mean': IMNET['mean'],
    'data_preprocessor.std': IMNET['std']})
COPY_MLP_CIFAR = dict(COPY_MLP, **{
    'model.student.backbone.drop_path_rate': 0.0, 'model.student.head.num_classes': 10,
    'model.teacher.pretrained': DEIT_T, 'model.teacher_input_norm': IMNET,
    'data_preprocessor.mean': [125.307, 122.961, 113.8575],
    'data_preprocessor.std': [51.5865, 50.847, 51.255]})
LINEARIZER = {
    'optim_wrapper.optimizer.lr': 5e-4, 'optim_wrapper.optimizer.weight_decay': 0.05,
    'param_scheduler.0.end': 20, 'param_scheduler.1.eta_min': 1e-6,
    'model.teacher.pretrained': 'checkpoints/clip_vit_b16_openai.pt',
    'model.teacher_input_norm': CLIP, 'model.teacher_recorders.stages.indices': [2, 5, 8, 11],
    'model.student_recorders.stages.indices': [2, 5, 8, 11],
    'model.patch_masking.ratio': 0.75}
# mmseg MAE-B UPerNet: AdamW 1e-4, wd .05, decay .65, LinearLR 1e-6 x 1500 then poly from 1500
UPERNET_B = {
    'optim_wrapper.optimizer.lr': 1e-4, 'optim_wrapper.optimizer.weight_decay': 0.05,
    'optim_wrapper.paramwise_cfg.layer_decay_rate': 0.65,
    'param_scheduler.0.end': 1500, 'param_scheduler.0.start_factor': 1e-6,
    'param_scheduler.1.begin': 1500, 'param_scheduler.1.power': 1.0,
    'param_scheduler.1.eta_min': 0.0}
ADV_SEG = dict(UPERNET_B, **{
    'model.backbone.out_indices': [2, 5, 8, 11], 'model.backbone.drop_path_rate': 0.1,
    'model.backbone.pretrained': LINEARIZER_OUT, 'model.decode_head.channels': 512,
    'model.auxiliary_head.loss_decode.loss_weight': 0.4})
# ViT-Adapter-L + Mask2Former: AdamW 2e-5, decay .9, drop-path .3, batch 16; detectron2's clip
M2F = {
    'optim_wrapper.optimizer.lr': 2e-5, 'optim_wrapper.optimizer.weight_decay': 0.05,
    'optim_wrapper.paramwise_cfg.layer_decay_rate': 0.9, 'optim_wrapper.clip_grad.max_norm': 0.01,
    'model.backbone.drop_path_rate': 0.3, 'model.backbone.out_indices': [7, 11, 15, 23],
    'model.decode_head.num_queries': 100, 'model.decode_head.loss_cls.loss_weight': 2.0,
    'model.decode_head.loss_mask.loss_weight': 5.0,
    'model.decode_head.loss_dice.loss_weight': 5.0,
    'model.decode_head.loss_cls.class_weight.-1': 0.1, 'model.patch_padding': 'center'}
M2F_ADE = dict(M2F, **{
    'model.decode_head.num_classes': 150, 'model.test_cfg.mode': 'whole',
    'model.data_preprocessor.size': [518, 518], 'pipe:test:Resize.scale': [2072, 518],
    'model.backbone.pretrained': STAGE2_OUT})
LINEAR_HEAD_ADALA = {
    'optim_wrapper.optimizer.lr': 1e-4, 'model.backbone.drop_path_rate': 0.2,
    'model.head.loss.label_smooth_val': 0.1, 'param_scheduler.0.end': 3,
    'param_scheduler.1.eta_min': 1e-6, 'pipe:val:ResizeEdge.scale': 585,
    'pipe:val:CenterCrop.crop_size': 512, 'model.backbone.pretrained': STAGE2_OUT}

RECIPES = {
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-b-elu_64xb64-300e_in1k-224x224.py':
        dict(COPY_MLP_IN, **{'model.student.backbone.attn_cfg': 'elu'}),
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-b-mhla_64xb64-300e_in1k-224x224.py':
        dict(COPY_MLP_IN, **{'model.student.backbone.attn_cfg.type': 'mhla',
                             'model.student.backbone.attn_cfg.block_grid': 2}),
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-b-ttt_64xb64-300e_in1k-224x224.py':
        dict(COPY_MLP_IN, **{'model.student.backbone.attn_cfg.type': 'ttt'}),
    'copy_mlp_distill_attn/copy-mlp_deit-b-elu_64xb64-300e_in1k-224x224.py':
        dict(COPY_MLP_IN, **{'model.distill_losses': None}),
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py':
        COPY_MLP_CIFAR,
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-mhla_8xb64-300e_cifar10-224x224.py':
        COPY_MLP_CIFAR,
    'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-ttt_8xb64-300e_cifar10-224x224.py':
        COPY_MLP_CIFAR,
    'linearizer/vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py':
        dict(LINEARIZER, **{'model.patch_masking.use_student_mask_token': True,
                            'model.student.drop_path_rate': 0.0}),
    # drop-path unset: the backbone's default 0.0 (README: the distillation stages' drop-path 0)
    'linearizer/vit-linearizer_clip-b16_vit-b-elu_16xb64-300e_in1k-224x224.py':
        dict(LINEARIZER, **{'model.student.drop_path_rate?': 'MISSING'}),
    'linearizer/linear-head_adventurer-b_16xb64-30e_in1k-224x224.py': {
        'optim_wrapper.optimizer.lr': 1e-4, 'optim_wrapper.optimizer.weight_decay': 0.05,
        'model.backbone.drop_path_rate': 0.1, 'model.head.loss.label_smooth_val': 0.1,
        'param_scheduler.0.end': 3, 'param_scheduler.0.start_factor': 1e-3,
        'param_scheduler.1.eta_min': 1e-6, 'model.backbone.pretrained': LINEARIZER_OUT},
    'linearizer/upernet_adventurer-b_8xb2-160k_ade20k-512x512.py': dict(ADV_SEG, **{
        'model.decode_head.num_classes': 150, 'model.test_cfg.mode': 'whole'}),
    'linearizer/upernet_adventurer-b_8xb2-80k_cityscapes-512x1024.py': dict(ADV_SEG, **{
        'model.decode_head.num_classes': 19, 'model.test_cfg.mode': 'slide',
        'model.test_cfg.crop_size': [512, 1024], 'model.test_cfg.stride': [341, 683],
        'model.data_preprocessor.size': [512, 1024]}),
    'segmentation/upernet_deit-b-relu-fullcopy_8xb2-160k_ade20k-512x512.py': dict(UPERNET_B, **{
        'model.backbone.attn_cfg': 'relu', 'model.backbone.pretrained': DEIT_B,
        'model.backbone.out_indices': [3, 5, 7, 11], 'model.backbone.drop_path_rate': 0.1,
        'model.decode_head.channels': 512, 'model.test_cfg.mode': 'whole'}),
    'segmentation/upernet_deit-b-relu-fullcopy-distill_8xb2-160k_ade20k-512x512.py':
        dict(UPERNET_B, **{
            'model.student.backbone.attn_cfg': 'relu',
            'model.student.backbone.pretrained': DEIT_B, 'model.teacher.pretrained': DEIT_B,
            'model.student.backbone.out_indices': [3, 5, 7, 11],
            'model.student.backbone.drop_path_rate': 0.1,
            'optim_wrapper.paramwise_cfg.backbone': 'student.backbone'}),
    'segmentation/upernet_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py': {
        'optim_wrapper.optimizer.lr': 3e-5, 'optim_wrapper.paramwise_cfg.layer_decay_rate': 0.9,
        'model.decode_head.channels': 768, 'model.backbone.drop_path_rate': 0.3,
        'model.backbone.pretrained': STAGE2_OUT, 'model.data_preprocessor.size': [518, 518],
        'param_scheduler.1.begin': 1500},
    'segmentation/mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py': dict(M2F_ADE, **{
        'model.backbone.attn_cfg': 'softmax',
        'model.backbone.pretrained': 'checkpoints/dinov2_vitl14_canonical.pth'}),
    'adala/mask2former_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py':
        dict(M2F_ADE, **{'model.backbone.attn_cfg': 'elu'}),
    'adala_dinov2_ade20k.py': dict(M2F_ADE, **{'model.backbone.attn_cfg': 'elu'}),
    'segmentation/mask2former_adala-dinov2-l-elu_8xb2-80k_cityscapes-512x1024.py': dict(M2F, **{
        'model.decode_head.num_classes': 19, 'model.test_cfg.mode': 'slide',
        'model.test_cfg.crop_size': [518, 1036], 'model.test_cfg.stride': [345, 690],
        'model.backbone.pretrained': STAGE2_OUT}),
    'segmentation/mask2former_adala-dinov2-l-elu_8xb1-80k_cityscapes-1024x1024.py': dict(M2F, **{
        'model.decode_head.num_classes': 19, 'model.test_cfg.mode': 'slide',
        'model.test_cfg.crop_size': [1022, 1022], 'model.test_cfg.stride': [682, 682],
        'model.data_preprocessor.size': [1024, 1024], 'model.backbone.pretrained': STAGE2_OUT}),
    'adala/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512.py': {
        'model.teacher.pretrained': DINOV2_L, 'model.student.pretrained': DINOV2_L,
        'model.student.attn_cfg': 'elu', 'model.trainable_params': ['blocks.*.attn.*'],
        'pipe:train:RandomResizedCrop.crop_ratio_range': [0.35, 1.0],
        'data_preprocessor.mean': IMNET['mean'], 'optim_wrapper.optimizer.lr': 1e-4},
    'adala/vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_in22k-512x512.py': {
        'model.teacher.pretrained': DINOV2_L, 'model.student.pretrained': None,
        'load_from': 'work_dirs/vit-adala-stage1-attn-align_dinov2-l-elu_8xb8-4e_coco-512x512/'
                     'epoch_4.pth',
        'param_scheduler.0.end': 1000, 'optim_wrapper.optimizer.lr': 5e-5},
    'adala/linear-head_adala-dinov2-l-elu_64xb16-30e_in1k-512x512.py': LINEAR_HEAD_ADALA,
    'adala/linear-probe_adala-dinov2-l-elu_64xb16-100e_in1k-512x512.py': {
        'optim_wrapper.optimizer.type': 'SGD', 'optim_wrapper.optimizer.lr': 0.1,
        'optim_wrapper.optimizer.momentum': 0.9, 'optim_wrapper.optimizer.weight_decay': 0.0,
        'optim_wrapper.paramwise_cfg.custom_keys.backbone.lr_mult': 0.0,
        'model.backbone.frozen_stages': 24, 'model.backbone.drop_path_rate': 0.0,
        'param_scheduler.0.eta_min': 0.0, 'pipe:val:ResizeEdge.scale': 585},
}


def test_every_recipe_has_a_row():
    demos = {r for r in CONFIGS if r.startswith('demo/')}
    assert set(CONFIGS) - demos == set(RECIPES), set(CONFIGS) ^ set(RECIPES)


@pytest.mark.parametrize('rel,key', [(r, k) for r, row in RECIPES.items() for k in row])
def test_recipe_values(rel, key):
    want = RECIPES[rel][key]
    cfg = load(rel)
    if key.endswith('?'):  # the key is absent: the code default applies
        try:
            got = get(cfg, key[:-1])
        except KeyError:
            got = 'MISSING'
    elif key.endswith('.-1'):  # last element of a list
        got = get(cfg, key[:-3])[-1]
    else:
        got = get(cfg, key)
    if isinstance(want, dict) and isinstance(got, dict):
        assert set(want) <= set(got), (got, want)
        for k, v in want.items():
            assert norm(got[k]) == pytest.approx(norm(v), rel=1e-7), (k, got[k], v)
    elif isinstance(want, float) or (isinstance(want, list) and want
                                      and isinstance(want[0], float)):
        assert norm(got) == pytest.approx(want, rel=1e-7), (got, want)
    else:
        assert norm(got) == want, (got, want)


@pytest.mark.parametrize('rel', [r for r in RECIPES if 'upernet' in r or 'mask2former' in r
                                 or r == 'adala_dinov2_ade20k.py'])
def test_seg_teacher_and_student_see_imagenet_statistics(rel):
    model = load(rel)['model']
    seg = model.get('student', model)
    pre = seg['data_preprocessor']
    assert norm(pre['mean']) == IMNET['mean'] and norm(pre['std']) == IMNET['std']
    assert pre['bgr_to_rgb'] and pre['seg_pad_val'] == 255
    assert model.get('teacher_input_norm') is None


@pytest.mark.parametrize('rel', [r for r in CONFIGS if 'upernet' in r or 'mask2former' in r
                                 or r == 'adala_dinov2_ade20k.py'])
def test_slide_window_stride_is_two_thirds_of_the_crop(rel):
    """mmseg's recipes slide their test window by about 2/3 of it (512 -> 341, 1024 -> 683,
    769 -> 513).  The 518-px DINOv2 configs had kept the 512-px window's 341, so
    ``--cfg-options model.test_cfg.mode=slide`` overlapped their windows by a third more."""
    model = load(rel)['model']
    test_cfg = model.get('student', model)['test_cfg']
    for crop, stride in zip(test_cfg['crop_size'], test_cfg['stride']):
        assert abs(stride - 2 * crop / 3) <= 1, (test_cfg['crop_size'], test_cfg['stride'])
