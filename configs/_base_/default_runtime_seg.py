# Runtime shared by every segmentation config (mmseg world).
default_scope = 'mmseg'
env_cfg = dict(
    cudnn_benchmark=True,
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
# No fixed `name`: the runner names the visualizer after the experiment, so several runs in
# one process (tools/demo.py) keep separate visualizers.
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends)
# Iteration-based logs; the LoggerHook of the schedules prints time, data_time and eta.
log_processor = dict(by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
tta_model = dict(type='SegTTAModel')
