# Runtime shared by every segmentation config (mmseg world).
default_scope = 'mmseg'
env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),  # tools/train.py switches to gloo on CPU-only machines
)
vis_backends = [dict(type='LocalVisBackend')]
# No fixed `name`: the runner names the visualizer after the experiment, so several runs in
# one process (tools/demo.py) keep separate visualizers.
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends)
# Iteration-based logs; the LoggerHook of the schedules prints time, data_time and eta.
log_processor = dict(by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
tta_model = dict(type='SegTTAModel')
