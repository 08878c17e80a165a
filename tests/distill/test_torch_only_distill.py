"""The torch-only distillation parts (``mmlinvit.distill``) in a plain PyTorch training loop.

References are written here, independently of the code under test: attention outputs are
captured with bare ``register_forward_hook`` calls and the loss is ``F.mse_loss`` averaged
over blocks times lambda.
"""
import re
from pathlib import Path
from typing import List

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.backbones import VisionTransformer
from mmlinvit.distill import (AttentionMapsRecorder, AttentionOutputMSELoss,
                              DistillationConfigError, ModuleInputsRecorder,
                              ModuleOutputsRecorder)

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(embed_dims=32, num_layers=3, num_heads=2, mlp_hidden_dims=64)


def _tiny(operator: str) -> VisionTransformer:
    return VisionTransformer(TINY, attn_cfg=operator, img_size=32, patch_size=8)


def _reference_attn_outputs(model: nn.Module, images: torch.Tensor) -> List[torch.Tensor]:
    """Attention outputs of every block, captured with plain forward hooks."""
    outs = {}
    handles = [blk.attn.register_forward_hook(
        lambda mod, args, out, i=i: outs.__setitem__(i, out.detach().clone()))
        for i, blk in enumerate(model.blocks)]
    try:
        model(images)
    finally:
        for h in handles:
            h.remove()
    return [outs[i] for i in range(len(model.blocks))]


def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_plain_loop_matches_reference_and_learns():
    torch.manual_seed(0)
    teacher = _tiny('softmax').eval().requires_grad_(False)
    student = _tiny('elu')  # its own random weights: a clear gap to close
    teacher_state = {k: v.clone() for k, v in teacher.state_dict().items()}
    criterion = AttentionOutputMSELoss(loss_weight=50.0)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    images = torch.randn(4, 3, 32, 32)

    # reference loss before any step: lambda x mean over blocks of the MSE
    with torch.no_grad():
        ref_t = _reference_attn_outputs(teacher, images)
        ref_s = _reference_attn_outputs(student, images)
    expected0 = 50.0 * torch.stack([F.mse_loss(s, t) for s, t in zip(ref_s, ref_t)]).mean()
    assert expected0.item() > 0

    losses = []
    with ModuleOutputsRecorder('blocks.{i}.attn').attach(student) as s_rec, \
            ModuleOutputsRecorder('blocks.{i}.attn').attach(teacher) as t_rec:
        assert _hook_count(student) == len(student.blocks) + 1  # + the reset pre-hook
        for _ in range(6):
            with torch.no_grad():
                teacher(images)
            student(images)
            s_out, t_out = s_rec.get(), t_rec.get()
            assert len(s_out) == len(t_out) == 3 and s_out[0].shape == (4, 17, 32)
            loss = criterion(s_out, t_out)
            losses.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    torch.testing.assert_close(torch.tensor(losses[0]), expected0, rtol=1e-5, atol=1e-7)
    assert losses[-1] < 0.5 * losses[0], losses
    # the teacher did not move, and every hook is gone after the with-block
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, teacher_state[k]), k
    assert _hook_count(student) == 0 and _hook_count(teacher) == 0


def test_records_are_reset_by_each_forward_of_the_attached_model():
    model = _tiny('softmax').eval()
    a, b = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)
    with ModuleInputsRecorder('blocks.{i}', indices=[-1]).attach(model) as rec, \
            ModuleOutputsRecorder('blocks.1.attn').attach(model) as out_rec, torch.no_grad():
        model(a)
        model(b)
        # input of the last block for the second batch, recomputed by hand
        tokens, hw = model.prepare_tokens(b)
        for blk in model.blocks[:-1]:
            tokens = blk(tokens, hw, model.num_prefix_tokens)
        torch.testing.assert_close(rec.get()[0], tokens)
        torch.testing.assert_close(out_rec.get(), _reference_attn_outputs(model, b)[1])
    # outside the with-block nothing is recorded and the hooks are gone
    assert _hook_count(model) == 0


class _Branchy(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, use_b: bool = True) -> torch.Tensor:
        x = self.a(x)
        return self.b(x) if use_b else x


def test_stale_records_are_not_returned():
    model = _Branchy()
    with ModuleOutputsRecorder('b').attach(model) as rec:
        model(torch.randn(1, 2))
        assert rec.get().shape == (1, 2)
        model(torch.randn(1, 2), use_b=False)  # 'b' did not run in this forward
        with pytest.raises(RuntimeError, match=r"\['b'\] did not run"):
            rec.get()


def test_recorder_errors_are_clear():
    model = _tiny('softmax')
    with pytest.raises(RuntimeError, match='not attached to a model'):
        with ModuleOutputsRecorder('blocks.0.attn'):
            pass
    with pytest.raises(DistillationConfigError, match="module 'blocks.0.atn' does not exist"):
        ModuleOutputsRecorder('blocks.0.atn').attach(model)
    with pytest.raises(DistillationConfigError, match='index 7 is out of range'):
        ModuleOutputsRecorder('blocks.{i}.attn', indices=[7]).attach(model)
    with pytest.raises(DistillationConfigError, match='no explicit attention map'):
        AttentionMapsRecorder('blocks.{i}.attn').attach(_tiny('ttt'))


def test_attention_maps_recorder_gives_softmax_rows():
    model = _tiny('softmax').eval()
    images = torch.randn(1, 3, 32, 32)
    with AttentionMapsRecorder('blocks.{i}.attn', indices=[0]).attach(model) as rec, \
            ModuleInputsRecorder('blocks.0.attn').attach(model) as x_rec, torch.no_grad():
        model(images)
        maps = rec.get()[0]
        x = x_rec.get()
    attn = model.blocks[0].attn
    q, k, _ = attn.split_qkv(x)
    torch.testing.assert_close(maps, ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1))


def test_integration_layer_registers_the_same_classes():
    from mmlinvit.distill import losses as torch_losses
    from mmlinvit.distill import recorders as torch_recorders
    from mmlinvit.models.distill import DistillationConfigError as IntegrationError
    from mmlinvit.models.distill import recorders as integration_recorders
    from mmlinvit.registry import MODELS
    for name in ('AttentionOutputMSELoss', 'FeatureMSELoss', 'AttentionMapLoss',
                 'ActivationMatchingLoss', 'MaskedPredictionLoss'):
        cls = getattr(torch_losses, name)
        assert MODELS.get(f'mmlinvit.{name}') is cls
    for name in ('ModuleRecorder', 'ModuleOutputsRecorder', 'ModuleInputsRecorder',
                 'AttentionMapsRecorder', 'build_recorder', 'RECORDERS'):
        assert getattr(integration_recorders, name) is getattr(torch_recorders, name)
    assert IntegrationError is DistillationConfigError


def test_readme_plain_torch_example_runs():
    """The README's plain-PyTorch block, executed as written."""
    text = (ROOT / 'README.md').read_text()
    section = text.split('### Distillation in a plain PyTorch loop', 1)[1]
    code = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    namespace: dict = {}
    torch.manual_seed(0)
    exec(compile(code, 'README.md', 'exec'), namespace)
    assert torch.isfinite(namespace['loss']) and namespace['loss'].item() > 0
    assert _hook_count(namespace['student']) == 0
