"""Mutation round 21 over ``tools/demo.py`` and the analysis modules behind the teacher-vs-
student figures, the digits task and the training curves (second pass).

Each test below failed on at least one single-line change of the module that the rest of the
suite let pass; each checks against a reference that does not run the code under test: the
recipe written in the module's docstring, values worked out by hand, or the plain objects
(``VIT_SIZES``, an optimizer) of the library:

* ``mmlinvit.analysis.compared_models``: ``vit_dims`` is a copy (changing it leaves
  ``VIT_SIZES`` and the pair alone);
* ``mmlinvit.analysis.digits_distill``: ``run_digits``' documented recipe (AdamW lr 2e-3 and
  weight decay 0.05, gradient clipping at 3, label smoothing 0.1, warm-up over the first tenth
  of the steps, at least one);
* ``mmlinvit.analysis.curves``: a loss term that reaches 0 is not "positive" and keeps the
  linear scale;
* ``mmlinvit.analysis.attention_gaps``: ``attention_output_stats`` returns the *teacher's*
  attention-output mean square (checked with plain forward hooks);
* ``tools/demo.py``: ``_iters_schedule`` at the demo configs' own length gives back their
  schedule (warm-up start factor, PolyLR ``eta_min``, power).
"""
import json
import math
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
import torch.nn as nn

from mmlinvit.analysis import digits_distill, save_loss_curves
from mmlinvit.analysis.compared_models import COMPARED_MODELS, SMOKE_MODEL
from mmlinvit.backbones import VIT_SIZES, VisionTransformer
from mmlinvit.utils.cli import load_script

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- compared_models
def test_vit_dims_is_a_copy_of_the_size_table() -> None:
    """Editing the returned dims (a caller scaling a model down) must not change
    ``VIT_SIZES`` nor what the next call returns."""
    pair = COMPARED_MODELS['vit-b16']
    before = dict(VIT_SIZES['b'])
    dims = pair.vit_dims
    dims['num_layers'] = 1
    assert VIT_SIZES['b'] == before
    assert pair.vit_dims == before
    smoke = SMOKE_MODEL.vit_dims
    smoke['embed_dims'] = 8
    assert SMOKE_MODEL.vit_dims['embed_dims'] == 64


# ----------------------------------------------------------------------------- digits_distill
def _digits_data(num: int = 16) -> Dict[str, Any]:
    """A random (frozen, eval) digits teacher and ``num`` distinct uint8 images."""
    torch.manual_seed(0)
    teacher = VisionTransformer(attn_cfg='softmax', **digits_distill.DIGITS_VIT).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    x = (torch.arange(num, dtype=torch.uint8)[:, None, None, None] * 7).expand(
        num, 3, 32, 32).contiguous()
    return dict(teacher=teacher, x_student=x, y_student=torch.arange(num) % 10,
                x_test=x[:4].clone(), y_test=torch.arange(4))


def test_run_digits_uses_the_documented_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Docstring of ``run_digits``: AdamW lr 2e-3, wd 0.05, clip 3, label smoothing 0.1,
    linear warm-up over the first tenth of the steps (10 steps: one step of warm-up)."""
    adamw: List[Dict[str, float]] = []
    clips: List[float] = []
    smoothing: List[float] = []
    lrs: List[float] = []
    real_adamw = torch.optim.AdamW
    real_clip = nn.utils.clip_grad_norm_
    real_ce = digits_distill.F.cross_entropy

    class SpyAdamW(real_adamw):

        def __init__(self, params: Any, **kwargs: Any) -> None:
            adamw.append(dict(kwargs))
            super().__init__(params, **kwargs)

        def step(self, *args: Any, **kwargs: Any) -> Any:
            lrs.append(self.param_groups[0]['lr'])
            return super().step(*args, **kwargs)

    def clip(params: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        clips.append(max_norm)
        return real_clip(params, max_norm, *args, **kwargs)

    def cross_entropy(*args: Any, **kwargs: Any) -> torch.Tensor:
        smoothing.append(kwargs.get('label_smoothing', 0.0))
        return real_ce(*args, **kwargs)

    monkeypatch.setattr(torch.optim, 'AdamW', SpyAdamW)
    monkeypatch.setattr(nn.utils, 'clip_grad_norm_', clip)
    monkeypatch.setattr(digits_distill.F, 'cross_entropy', cross_entropy)
    digits_distill.run_digits(_digits_data(), 'random', None, 0, 'elu', 10, 4)
    assert adamw == [dict(lr=2e-3, weight_decay=0.05)]
    assert clips == [3.0] * 10
    assert smoothing == [0.1] * 10
    # warm-up of one step (factor (0 + 1) / 1 = 1), then cosine over the 9 other steps:
    # step s >= 1 has 1e-3 + (1 - 1e-3) * (1 + cos(pi * (s - 1) / 9)) / 2 of the lr
    expected = [2e-3] + [2e-3 * (1e-3 + (1 - 1e-3) * 0.5 * (1 + math.cos(math.pi * (s - 1) / 9)))
                         for s in range(1, 10)]
    assert lrs == pytest.approx(expected, rel=1e-9)


# ----------------------------------------------------------------------------- curves
def _yscale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, values: List[float]) -> str:
    """Y scale of the one panel ``save_loss_curves`` draws for these ``loss`` values."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    closed: List[Any] = []
    real_close = plt.close

    def close(fig: Any = None) -> None:
        closed.append(fig)
        real_close(fig)

    monkeypatch.setattr(plt, 'close', close)
    path = tmp_path / 'scalars.json'
    path.write_text(''.join(json.dumps(dict(loss=v, step=i)) + '\n'
                            for i, v in enumerate(values)))
    save_loss_curves(str(tmp_path / 'curves.png'), {'run': str(path)})
    return closed[-1].axes[0].get_yscale()


def test_a_zero_loss_keeps_the_linear_scale(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Documented rule: log scale for *positive* terms spanning more than a decade; a term
    that reaches 0 (0 -> 20) is not positive and a log axis could not show it."""
    assert _yscale(tmp_path, monkeypatch, [20.0, 0.0]) == 'linear'


# ----------------------------------------------------------------------------- tools/demo.py
@pytest.fixture(scope='module')
def demo() -> Any:
    """tools/demo.py as a module."""
    return load_script(str(REPO / 'tools' / 'demo.py'), 'round21_demo_analysis_demo')


@pytest.mark.parametrize('config', ['TEACHER_CFG', 'STUDENT_CFG'])
def test_demo_schedule_at_the_configs_length_is_the_configs_own(demo: Any, config: str) -> None:
    """``_iters_schedule`` only rescales the demo configs' schedule: at the config's own
    length and warm-up (30 iterations) it must give back the config's LinearLR warm-up and
    PolyLR decay (start factor, eta_min, power) unchanged."""
    from mmengine.config import Config
    path = getattr(demo, config)
    original = Config.fromfile(path, format_python_code=False)
    cfg = Config.fromfile(path, format_python_code=False)
    iters = original.train_cfg.max_iters
    warmup = original.param_scheduler[0]['end']
    demo._iters_schedule(cfg, iters, warmup)
    assert [dict(s) for s in cfg.param_scheduler] == [dict(s) for s in
                                                     original.param_scheduler]



# ----------------------------------------------------------------------------- attention_gaps
def test_attention_output_stats_mean_square_is_the_teachers() -> None:
    """Docstring: per block, the *teacher's* attention-output mean square and the student's
    relative gap ``mean((s - t)^2) / mean(t^2)``, from plain forward hooks on both models'
    ``blocks[i].attn`` (a student whose outputs have another scale than the teacher's)."""
    from mmlinvit.analysis.attention_gaps import attention_output_stats
    from mmlinvit.backbones import LinearVisionTransformer
    torch.manual_seed(0)
    kwargs = dict(arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32),
                  family='deit', patch_size=8, img_size=16)
    teacher = VisionTransformer(attn_cfg='softmax', **kwargs).eval()
    student = LinearVisionTransformer(attn_cfg='elu', **kwargs).eval()
    with torch.no_grad():
        for p in student.parameters():
            p.mul_(3.0)  # other scale: the student's mean square is not the teacher's
    outs: Dict[str, List[torch.Tensor]] = dict(t=[], s=[])
    handles = [m.blocks[i].attn.register_forward_hook(
        lambda mod, args, out, key=key: outs[key].append(out.detach()))
        for key, m in (('t', teacher), ('s', student)) for i in range(2)]
    x = torch.randn(2, 3, 16, 16)
    try:
        with torch.no_grad():
            teacher(x)
            student(x)
    finally:
        for h in handles:
            h.remove()
    mean_sq, gaps = attention_output_stats(student, teacher, x)
    t64 = [t.double() for t in outs['t']]
    s64 = [s.double() for s in outs['s']]
    expected_sq = [float(t.pow(2).mean()) for t in t64]
    expected_gap = [float((s - t).pow(2).mean() / t.pow(2).mean()) for s, t in zip(s64, t64)]
    assert [float(s.pow(2).mean()) for s in s64] != pytest.approx(expected_sq, rel=1e-2)
    assert mean_sq == pytest.approx(expected_sq, rel=1e-5)
    assert gaps == pytest.approx(expected_gap, rel=1e-5)
