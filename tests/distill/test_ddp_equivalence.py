"""Data-parallel training is the same computation as one process with the whole batch.

The "Copy the MLP, distill the attention" recipe (DeiT-T teacher, ELU student, CE with label
smoothing + 50 x attention-output MSE, AdamW, gradient clipping at 3.0) is shrunk to a tiny CPU
run (:func:`distill_testing.shrink_config`: 12 generated images, 2 blocks of width 16, a
random tiny teacher checkpoint) and trained for one epoch of 3 iterations

* in one process (``tools/train.py``) with 4 images per iteration, and
* in two gloo processes (``tools/dist_train.sh``, torchrun) with 2 images per rank.

Every term of the objective is a mean over the samples of the batch, and DDP averages the
gradients over the ranks, so the two runs compute the same gradients up to float32 rounding:
the one-process loss of every iteration equals the mean of the two ranks' losses, term by term,
and the trained student, its AdamW moments included, are the same.  The independent reference
is the one-process run; nothing of the distributed path (DDP wrapper, gloo all-reduce, the
sampler's split of the batch, the clipped global gradient norm) is on its side.

What makes the runs comparable (each choice is asserted or set below):

* the same batches: the recipe's ``DefaultSampler(shuffle=True)`` draws one permutation from
  ``randomness.seed`` on every rank and rank ``r`` of ``w`` takes positions ``r::w`` of it, so
  iteration ``i`` of the 2-process run sees, split over the ranks, the 4 images of iteration
  ``i`` of the 1-process run; the tiny pipeline (Resize, no batch augmentation) draws nothing;
* no per-rank random numbers in the model: ``drop_path_rate=0`` (mmlinvit seeds each rank's
  stream differently, as DeiT / DINOv2);
* a constant learning rate (the recipe's warm-up is per iteration, 1e-3 of the rate here).

Why it catches a wrongly reduced loss (shown on a scratch copy of the repo: the distillation
MSE summed over the local batch instead of averaged, and the MSE divided by the local teacher
energy): with per-rank batch ``b`` and world size ``w``, a term ``L_r = f(local batch)`` is
averaged by DDP as ``(1/w) sum_r L_r``.  It equals the one-process ``L(all b*w samples)`` only
if ``L`` is a plain mean over samples; a sum over the local batch gives ``1/w`` of the global
value, and a normalisation by a statistic of the local batch (its size, its energy, a token
count) gives a mean of per-rank ratios instead of the global ratio.  The per-term loss check
below sees either at once (measured: relative errors of 0.5 and 5.6e-2 against the 1e-5
tolerance; the weights then differ by 2.7e-2 and 1.8e-1 of their scale).  Each term is compared
on its own: the distillation term is ~1e-5 of the total at the first step, so the total alone
hides a halved term there (5.9e-6 relative).  A loss whose value is right but whose gradient is
scaled per rank is seen by the weights and by the AdamW moments of the checkpoint (the first is
the running mean of the clipped gradients; the weights alone may hide a uniformly scaled
gradient: Adam's first step is ``lr * sign(grad)`` whatever the scale).  Measured on correct
code: <= 1.1e-7 relative on the losses, <= 4.2e-8 absolute (3.5e-6 of the tensor's scale, on
the qkv biases) on the weights, <= 6.8e-7 relative on the AdamW moments.
"""
import os.path as osp
import sys
from typing import Dict

import pytest
import torch
from mmengine.config import Config

from distill_testing import CONFIGS, save_tiny_vit_checkpoint, shrink_config, write_image_folder

# The launch helpers of the training-reliability tests (tools/train.py in process,
# tools/dist_train.sh with a loss recorder hook imported by name from tests/engine).
ENGINE_TESTS = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'engine')
if ENGINE_TESTS not in sys.path:
    sys.path.insert(0, ENGINE_TESTS)

from test_exact_resume import _dist_train  # noqa: E402
from torchrun_retry import GLOO_TEARDOWN_ABORT  # noqa: E402
from train_testing import train_in_process  # noqa: E402

CONFIG = 'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py'
NUM_IMAGES = 12  # 6 per class
GLOBAL_BATCH = 4
WORLD_SIZE = 2
ITERS = NUM_IMAGES // GLOBAL_BATCH
#: Relative tolerance of every comparison; float32 rounding of a batch split in two is ~1e-7.
RTOL = 1e-5
#: Loss keys the recipe logs (``loss`` is their sum); each is compared on its own.
LOSS_KEYS = ('loss', 'student.loss', 'distill.loss_attn_out')
LR = 1e-3
#: Absolute slack of the weights on top of ``RTOL``: 1e-4 of one AdamW step (a wrong gradient
#: moves a weight by up to ``LR`` per step).  Needed by tensors that hold nothing but their 3
#: updates (the qkv biases, ~3e-3 after 3 steps, measured 3.5e-6 relative, 1e-8 absolute).
PARAM_ATOL = 1e-4 * LR
#: Relative tolerance of the trained weights.  AdamW divides each gradient by its own running
#: RMS, so an element whose gradient is nearly zero turns float32 rounding of the reduction
#: (which differs between CPUs: the matmul kernels do) into a visible weight difference: 5.6e-5
#: of the scale on one 2-core machine, under 1e-5 on another.  A wrongly reduced loss moves the
#: weights by 2.7e-2 and 1.8e-1 of their scale (measured, see above), and the AdamW moments,
#: which are not normalised, keep the RTOL bound.
WEIGHT_RTOL = 1e-3


def _config(data_root: str, teacher_ckpt: str, batch_size: int) -> Config:
    """The shrunk recipe with a constant learning rate, no drop-path and no validation.

    Args:
        data_root: Generated image folder.
        teacher_ckpt: Tiny DeiT teacher checkpoint.
        batch_size: Images per process and iteration.
    """
    cfg = Config.fromfile(osp.join(CONFIGS, CONFIG))
    shrink_config(cfg, data_root, 'unused', max_epochs=1, teacher_ckpt=teacher_ckpt)
    cfg.train_dataloader.batch_size = batch_size
    assert cfg.train_dataloader.sampler == dict(type='DefaultSampler', shuffle=True)
    cfg.randomness = dict(seed=0)
    cfg.model.student.backbone.drop_path_rate = 0.0
    cfg.param_scheduler = []
    cfg.optim_wrapper.optimizer.lr = LR
    cfg.train_cfg.val_interval = 100  # no validation: only the training step is compared
    cfg.log_level = 'WARNING'
    return cfg


def _relative_error(value: torch.Tensor, reference: torch.Tensor, atol: float = 0.0) -> float:
    """max |value - reference| / (max |reference| + atol / RTOL) of one tensor: at most RTOL
    when the error is within ``RTOL * max |reference| + atol``."""
    scale = reference.abs().max().item() + atol / RTOL
    err = (value - reference).abs().max().item()
    return err / scale if scale > 0 else err


def _student_state(path: str) -> Dict[str, torch.Tensor]:
    """The student's floating entries of a runner checkpoint (``student.`` keys)."""
    ckpt = torch.load(path, map_location='cpu', weights_only=False)
    return {k: v for k, v in ckpt['state_dict'].items()
            if k.startswith('student.') and v.is_floating_point()}


def _adam_moments(path: str) -> Dict[str, torch.Tensor]:
    """``{'<param index>.exp_avg' / '.exp_avg_sq': tensor}`` of the checkpoint's optimizer."""
    state = torch.load(path, map_location='cpu', weights_only=False)['optimizer']['state']
    return {f'{idx}.{key}': value for idx, entry in state.items()
            for key, value in entry.items() if key in ('exp_avg', 'exp_avg_sq')}


@pytest.fixture(scope='module')
def runs(tmp_path_factory) -> dict:
    """The 1-process and the 2-process run: their work dirs and losses, ``one``:
    ``{iteration: {key: value}}``, ``two``: ``{rank: {iteration: {key: value}}}``."""
    tmp_path = tmp_path_factory.mktemp('ddp_equivalence')
    data = write_image_folder(str(tmp_path / 'data'), num_per_class=NUM_IMAGES // 2)
    teacher = save_tiny_vit_checkpoint(str(tmp_path / 'deit.pth'), family='deit')

    one_dir = str(tmp_path / 'one')
    one = train_in_process(_config(data, teacher, GLOBAL_BATCH), tmp_path, 'one', one_dir)

    two_dir = str(tmp_path / 'two')
    proc, two = _dist_train(_config(data, teacher, GLOBAL_BATCH // WORLD_SIZE), tmp_path, 'two',
                            two_dir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert GLOO_TEARDOWN_ABORT not in proc.stderr
    return dict(one=one, one_dir=one_dir, two=two, two_dir=two_dir)


def test_losses_are_the_one_process_losses(runs):
    one, two = runs['one'], runs['two']
    assert sorted(one) == list(range(1, ITERS + 1))
    assert sorted(two) == list(range(WORLD_SIZE))
    assert all(sorted(two[rank]) == list(range(1, ITERS + 1)) for rank in two)
    errors = {}
    for it in range(1, ITERS + 1):
        assert set(LOSS_KEYS) <= set(one[it]), one[it]
        for key in LOSS_KEYS:
            ranks = [two[rank][it][key] for rank in range(WORLD_SIZE)]
            # not vacuous: the ranks train on different images and the term is not zero
            assert ranks[0] != ranks[1] and one[it][key] > 0, (it, key, ranks)
            mean = sum(ranks) / WORLD_SIZE
            errors[it, key] = abs(mean - one[it][key]) / abs(one[it][key])
    assert max(errors.values()) <= RTOL, errors
    # the student learned: its distillation term moved over the 3 steps
    assert one[ITERS]['distill.loss_attn_out'] != one[1]['distill.loss_attn_out']


def test_trained_student_and_optimizer_state_are_the_one_process_ones(runs):
    one_ckpt = osp.join(runs['one_dir'], 'epoch_1.pth')
    two_ckpt = osp.join(runs['two_dir'], 'epoch_1.pth')
    for path in (one_ckpt, two_ckpt):
        assert torch.load(path, map_location='cpu', weights_only=False)['meta']['iter'] == ITERS

    one, two = _student_state(one_ckpt), _student_state(two_ckpt)
    assert sorted(one) == sorted(two) and len(one) > 20
    errors = {name: _relative_error(two[name], one[name], PARAM_ATOL) for name in one}
    assert max(errors.values()) <= WEIGHT_RTOL, sorted(errors.items(),
                                                       key=lambda kv: -kv[1])[:5]

    # AdamW's moments: the first is the decayed sum of the 3 (clipped) gradients, the second
    # of their squares; a gradient scaled or normalised per rank shows up here even where
    # the Adam update (about lr * sign(grad) in the first steps) hides it.
    one_m, two_m = _adam_moments(one_ckpt), _adam_moments(two_ckpt)
    assert sorted(one_m) == sorted(two_m) and len(one_m) == 2 * len(one) > 0
    assert all(v.abs().max() > 0 for k, v in one_m.items() if k.endswith('exp_avg_sq'))
    errors = {name: _relative_error(two_m[name], one_m[name]) for name in one_m}
    assert max(errors.values()) <= RTOL, sorted(errors.items(), key=lambda kv: -kv[1])[:5]
