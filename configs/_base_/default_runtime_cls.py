# Runtime shared by every classification / distillation config (mmpretrain world).
default_scope = 'mmpretrain'
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    # save_best: the best validated model survives max_keep_ckpts (DeiT keeps its best
    # checkpoint by top-1); 'auto' takes the evaluator's first metric (accuracy/top1).
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3, save_best='auto'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='VisualizationHook', enable=False),
)
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),  # tools/train.py switches to gloo on CPU-only machines
)
# Curves: LocalVisBackend writes every logged scalar to <work_dir>/<timestamp>/vis_data/
# scalars.json (tools/demo.py plots them as loss_curves.png).  TensorBoard: `pip install
# tensorboard`, run with MMLINVIT_TENSORBOARD=1 (event files go to the same vis_data/ folder),
# then `tensorboard --logdir work_dirs`.
use_tensorboard = '{{$MMLINVIT_TENSORBOARD:0}}'
if use_tensorboard not in ('0', '1'):
    raise ValueError(f'MMLINVIT_TENSORBOARD must be 0 or 1, got {use_tensorboard!r}')
vis_backends = [dict(type='LocalVisBackend')] + (
    [dict(type='TensorboardVisBackend')] if use_tensorboard == '1' else [])
visualizer = dict(type='UniversalVisualizer', vis_backends=vis_backends)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, deterministic=False)
