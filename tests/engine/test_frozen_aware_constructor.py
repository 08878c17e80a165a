"""Frozen modules (a distillation teacher, ViT-AdaLA Stage 1's frozen MLPs) are reported in one
line: mmengine warned once per parameter (about 590 warnings per DINOv2-L Stage-1 start)."""
import logging

import torch
import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor

from mmlinvit.engine.optimizers import FrozenAwareOptimWrapperConstructor

from train_testing import captured_log


class Block(nn.Module):

    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.mlp = nn.Linear(4, 4)


class Model(nn.Module):

    def __init__(self):
        super().__init__()
        self.student = nn.ModuleList([Block(), Block()])
        self.teacher = nn.ModuleList([Block(), Block()])
        # a frozen parameter of a partly trained module (a Stage-1 student's cls_token)
        self.cls_token = nn.Parameter(torch.zeros(1, 4), requires_grad=False)
        for p in self.teacher.parameters():
            p.requires_grad = False
        for block in self.student:
            for p in list(block.mlp.parameters()) + list(block.norm.parameters()):
                p.requires_grad = False


CFG = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05))
PARAMWISE = dict(norm_decay_mult=0.0, bias_decay_mult=0.0)


def _groups(wrapper, model):
    names = {id(p): n for n, p in model.named_parameters()}
    return sorted((names[id(p)], g['lr'], g['weight_decay'])
                  for g in wrapper.optimizer.param_groups for p in g['params'])


def test_same_groups_as_mmengine_and_one_line():
    model = Model()
    with captured_log(logging.INFO) as theirs_log:
        theirs = DefaultOptimWrapperConstructor(dict(CFG), PARAMWISE)(model)
    with captured_log(logging.INFO) as ours_log:
        ours = FrozenAwareOptimWrapperConstructor(dict(CFG), PARAMWISE)(model)
    assert _groups(ours, model) == _groups(theirs, model)
    assert sum('is skipped since its requires_grad=False' in m for m in theirs_log) == 21
    assert not any('is skipped since' in m for m in ours_log)
    summary = [m for m in ours_log if m.startswith('Not optimised')]
    assert summary == ['Not optimised (requires_grad=False): 21 parameter tensors of '
                       'cls_token (1), student.*.mlp (4), student.*.norm (4), teacher (12)'
                       ], summary


def test_training_runs_use_it_for_the_default_constructor():
    from mmengine.config import Config

    from mmlinvit.engine.launch import add_training_safeguards
    cfg = Config(dict(optim_wrapper=dict(CFG)))
    add_training_safeguards(cfg)
    assert cfg.optim_wrapper.constructor == 'mmlinvit.FrozenAwareOptimWrapperConstructor'
    custom = Config(dict(optim_wrapper=dict(
        CFG, constructor='mmlinvit.LayerDecayOptimWrapperConstructor')))
    add_training_safeguards(custom)
    assert custom.optim_wrapper.constructor == 'mmlinvit.LayerDecayOptimWrapperConstructor'


def test_param_groups_are_plain_dicts_that_compile():
    """With a paramwise_cfg the groups were mmengine ConfigDicts: mmengine's compile=True
    (train_step compiled, optimizer step included) stopped every shipped config at its first
    step ("'UserDefinedDictVariable' object has no attribute 'items'")."""
    import torch
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmlinvit.backbones import VisionTransformer

    class Classifier(nn.Module):

        def __init__(self):
            super().__init__()
            self.backbone = VisionTransformer(dict(embed_dims=8, num_layers=1, num_heads=2,
                                                   mlp_hidden_dims=16), img_size=8,
                                              patch_size=4, out_type='cls_token')
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            return self.head(self.backbone(x)[-1])

    for constructor, paramwise in (
            ('mmlinvit.FrozenAwareOptimWrapperConstructor', PARAMWISE),
            ('mmlinvit.LayerDecayOptimWrapperConstructor', dict(layer_decay_rate=0.9))):
        torch.manual_seed(0)
        model = Classifier()
        cfg = Config(dict(o=dict(CFG, constructor=constructor, paramwise_cfg=paramwise))).o
        wrapper = build_optim_wrapper(model, cfg)
        groups = wrapper.optimizer.param_groups
        assert all(type(g) is dict and type(g['params']) is list for g in groups), constructor
        assert {g['weight_decay'] for g in groups} >= {0.0}

        def step(x):
            loss = model(x).pow(2).mean()
            wrapper.update_params(loss)
            return loss.detach()

        compiled = torch.compile(step, backend='eager')
        for _ in range(2):
            assert torch.isfinite(compiled(torch.randn(2, 3, 8, 8)))
        torch._dynamo.reset()
