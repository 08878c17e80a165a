# The demo's linear student, AdaLA Stage 3: the teacher's architecture with ELU+1 kernel
# linear attention in every block, initialised from the Stage-2 student checkpoint
# (tools/demo.py sets `pretrained`), fine-tuned with UPerNet on the toy scenes with
# layer-wise learning-rate decay.
_base_ = ['./upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py']
model = dict(
    backbone=dict(
        type='mmlinvit.LinearVisionTransformer',
        attn_cfg='elu',
        pretrained='work_dirs/demo/stage2/student_backbone.pth'))
missing_path_hints = {
    'model.backbone.pretrained':
    'The demo\'s Stage-2 student, written by python tools/demo.py (it trains the teacher and '
    'Stages 1-2 first), or pass --cfg-options model.backbone.pretrained=None to start from a '
    'random init.',
}
max_iters = 200
optim_wrapper = dict(
    optimizer=dict(lr=2e-3),
    constructor='mmlinvit.LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(_delete_=True, layer_decay_rate=0.9))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.05, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=1e-5, power=1.0, begin=30, end=max_iters, by_epoch=False),
]
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(checkpoint=dict(interval=max_iters))
