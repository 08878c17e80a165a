"""ViT-Linearizer masking with the Adventurer student: no masked-token information reaches the
activation-matching loss.

Two properties, each with a control showing the check can fail:

1. The student never sees the pixels under its masked patches (they are replaced by its mask
   token before the first block), so with the teacher's input held fixed, changing those
   pixels changes neither the student's records nor either loss term.  The Adventurer is a
   recurrent mixer: leaked masked content would spread to every later (visible) token.
2. L_act only reads the visible rows / columns of the similarity maps: changing the recorded
   student or teacher stage features at masked positions (or the special tokens: the
   Adventurer's class token is LAST, CLIP's FIRST) leaves L_act unchanged, while changing them
   at visible positions changes it.  L_mask, in turn, reads the masked positions.
"""
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from mmlinvit.registry import MODELS
from linearizer_testing import (DISTILL_CONFIG, IMG_SIZE, PATCH, TEACHER_ARCH, config_path,
                                student_arch)

GRID = IMG_SIZE // PATCH


def build_model(**overrides):
    """The distillation model of the real Adventurer config at tiny size (random teacher),
    with the config's data preprocessor as the Runner gives it."""
    full = Config.fromfile(config_path(DISTILL_CONFIG))
    cfg = full.model
    cfg.data_preprocessor = full.data_preprocessor
    cfg.student.update(arch=student_arch(), img_size=IMG_SIZE, patch_size=PATCH)
    cfg.teacher.update(arch=dict(TEACHER_ARCH), img_size=IMG_SIZE, patch_size=PATCH,
                       pretrained=None)
    cfg.student_recorders.stages.indices = [0, 1, 2, 3]
    cfg.teacher_recorders.stages.indices = [0, 1, 2, 3]
    cfg.connectors.proj.update(in_channels=student_arch()['embed_dims'],
                               out_channels=TEACHER_ARCH['embed_dims'])
    cfg.update(overrides)
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(cfg.to_dict())
    return model.eval()


def patch_pixels(mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W) bool: the pixels of the patches where ``mask`` (B, h * w) is True."""
    grid = mask.reshape(mask.shape[0], 1, GRID, GRID).float()
    return torch.nn.functional.interpolate(grid, scale_factor=PATCH, mode='nearest').bool()


def fix_mask(model, mask):
    """Every loss() call of ``model`` uses ``mask``."""
    model._sample_patch_mask = lambda inputs, advance: mask


def losses(model, x):
    with torch.no_grad():
        out = model.loss(x)
    return out['distill.loss_act'], out['distill.loss_mask']


@pytest.fixture(scope='module')
def model():
    return build_model()


@pytest.fixture(scope='module')
def batch(model):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, IMG_SIZE, IMG_SIZE, generator=generator)
    mask = model._sample_patch_mask(x, advance=False)
    assert mask.shape == (2, GRID * GRID) and (mask.sum(1) == 48).all()
    return x, mask


def test_student_uses_its_own_mask_token(model, batch):
    x, _ = batch
    assert model.mask_token is None and 'mask_token' not in dict(model.named_parameters())
    model.train()
    try:
        total, _ = model.parse_losses(model.loss(x))
        total.backward()
    finally:
        model.eval()
    grad = model.student.mask_token.grad
    assert grad is not None and grad.abs().sum() > 0
    assert model.connectors.proj.linear.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.teacher.parameters())
    model.zero_grad(set_to_none=True)


def test_masked_pixels_never_reach_the_student(model, batch):
    x, mask = batch
    fix_mask(model, mask)
    run_teacher = model._run_teacher
    model._run_teacher = lambda inputs: run_teacher(x)  # the teacher always sees x
    records = []
    handles = [blk.register_forward_hook(lambda m, a, out: records.append(out.clone()))
               for blk in model.student.layers]
    try:
        act, mask_loss = losses(model, x)
        clean = list(records)
        records.clear()
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(7)) * 5
        perturbed = torch.where(patch_pixels(mask), x + noise, x)
        assert not torch.equal(perturbed, x)
        act_p, mask_p = losses(model, perturbed)
        # every student token of every block (visible ones included) is bit-identical
        assert len(records) == len(clean) == 4
        for a, b in zip(clean, records):
            assert torch.equal(a, b)
        assert act.item() > 0 and mask_loss.item() > 0
        assert torch.equal(act, act_p) and torch.equal(mask_loss, mask_p)

        # control: changing pixels of ONE visible patch per image changes both terms
        visible = torch.zeros_like(mask)
        for b in range(mask.shape[0]):
            visible[b, (~mask[b]).nonzero()[0]] = True
        act_v, mask_v = losses(model, torch.where(patch_pixels(visible), x + noise, x))
        assert abs(act_v.item() - act.item()) > 1e-5
        assert abs(mask_v.item() - mask_loss.item()) > 1e-7
    finally:
        for h in handles:
            h.remove()
        del model._run_teacher, model._sample_patch_mask


def perturb_records(recorder, positions, prefix, scale=10.0):
    """Makes ``recorder.get`` return its records with ``positions`` (B, N_patches) replaced
    by noise; ``prefix`` is the number of special tokens in front of the patches."""
    get = recorder.get
    generator = torch.Generator().manual_seed(11)

    def perturbed_get(where):
        value = get(where)
        values = value if isinstance(value, list) else [value]
        out = []
        for t in values:
            t = t.clone()
            noise = torch.randn(t.shape, generator=generator) * scale
            sel = torch.zeros(t.shape[:2], dtype=torch.bool)
            sel[:, prefix:prefix + positions.shape[1]] = positions
            out.append(torch.where(sel.unsqueeze(-1), t + noise, t))
        return out if isinstance(value, list) else out[0]

    recorder.get = perturbed_get
    return lambda: delattr(recorder, 'get')


def test_act_loss_reads_visible_tokens_only(model, batch):
    x, mask = batch
    fix_mask(model, mask)
    try:
        act, mask_loss = losses(model, x)
        student_stages = model.student_recorders['stages']
        teacher_stages = model.teacher_recorders['stages']
        student_final = model.student_recorders['final']

        # student stage features at masked positions (Adventurer: patches first, cls last)
        undo = perturb_records(student_stages, mask, prefix=0)
        act_p, mask_p = losses(model, x)
        undo()
        torch.testing.assert_close(act_p, act, atol=1e-6, rtol=0)
        assert torch.equal(mask_p, mask_loss)

        # teacher stage features at masked positions (CLIP: cls first, patches after)
        undo = perturb_records(teacher_stages, mask, prefix=1)
        act_p, _ = losses(model, x)
        undo()
        torch.testing.assert_close(act_p, act, atol=1e-6, rtol=0)

        # special tokens: the Adventurer's class token (last) and CLIP's (first)
        last = torch.ones(mask.shape[0], 1, dtype=torch.bool)
        undo_s = perturb_records(student_stages, last, prefix=GRID * GRID)
        undo_t = perturb_records(teacher_stages, last, prefix=0)
        act_p, _ = losses(model, x)
        undo_s()
        undo_t()
        torch.testing.assert_close(act_p, act, atol=1e-6, rtol=0)

        # the final student features at masked positions feed L_mask, never L_act
        undo = perturb_records(student_final, mask, prefix=0)
        act_p, mask_p = losses(model, x)
        undo()
        assert torch.equal(act_p, act)
        assert mask_p.item() > mask_loss.item() + 1e-3

        # controls: visible positions do reach L_act
        undo = perturb_records(student_stages, ~mask, prefix=0)
        act_p, _ = losses(model, x)
        undo()
        assert abs(act_p.item() - act.item()) > 1e-4
        undo = perturb_records(teacher_stages, ~mask, prefix=1)
        act_p, _ = losses(model, x)
        undo()
        assert abs(act_p.item() - act.item()) > 1e-4
    finally:
        del model._sample_patch_mask


def test_wrong_student_token_layout_would_leak_masked_tokens(batch):
    """Control for the layout: reading the Adventurer's records as [cls, patches] (a ViT's
    layout) shifts every row by one token, so masked-position features reach L_act."""
    x, mask = batch
    wrong = build_model(student_token_layout=(1, 0))
    fix_mask(wrong, mask)
    act, _ = losses(wrong, x)
    undo = perturb_records(wrong.student_recorders['stages'], mask, prefix=0)
    act_p, _ = losses(wrong, x)
    undo()
    assert abs(act_p.item() - act.item()) > 1e-4


def test_student_mask_token_needs_one_in_the_student():
    from mmlinvit.models.distill import DistillationConfigError
    cfg = Config.fromfile(config_path(DISTILL_CONFIG)).model
    student = dict(cfg.student, arch=student_arch(), img_size=IMG_SIZE, patch_size=PATCH,
                   with_mask_token=False)
    with pytest.raises(DistillationConfigError, match='with_mask_token=True'):
        build_model(student=student)
    with pytest.raises(DistillationConfigError, match="unknown keys \\['token'\\]"):
        build_model(patch_masking=dict(ratio=0.75, token='student'))


@pytest.mark.parametrize('rel', [
    'linearizer/linear-head_adventurer-b_16xb64-30e_in1k-224x224.py',
    'linearizer/upernet_adventurer-b_8xb2-160k_ade20k-512x512.py',
    'linearizer/upernet_adventurer-b_8xb2-80k_cityscapes-512x1024.py',
])
def test_missing_distilled_student_names_the_distillation_config(rel):
    from mmlinvit.engine.preflight import MissingInputsError, check_inputs
    cfg = Config.fromfile(config_path(rel))
    with pytest.raises(MissingInputsError,
                       match='vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py'):
        check_inputs(cfg)


@pytest.mark.parametrize('family', ['deit3', 'mae'])
def test_other_teacher_layouts(family, batch, tmp_path):
    """DeiT-III / MAE teachers (their checkpoints through pretrained=) work unchanged."""
    from mmlinvit.backbones import VisionTransformer
    torch.manual_seed(1)
    teacher = VisionTransformer(arch=dict(TEACHER_ARCH), family=family, patch_size=PATCH,
                                img_size=IMG_SIZE)
    path = str(tmp_path / f'{family}.pth')
    torch.save({'model': teacher.state_dict()}, path)
    cfg = Config.fromfile(config_path(DISTILL_CONFIG)).model
    # these teachers were trained on the data preprocessor's ImageNet statistics: no CLIP
    # teacher_input_norm
    model = build_model(teacher=dict(cfg.teacher, family=family, arch=dict(TEACHER_ARCH),
                                     img_size=IMG_SIZE, patch_size=PATCH, pretrained=path),
                        teacher_input_norm=None)
    assert model.teacher_input_norm is None
    for key, value in teacher.state_dict().items():
        assert torch.equal(model.teacher.state_dict()[key], value), key
    assert model.token_layouts['teacher'] == (1, 0)
    act, mask_loss = losses(model, batch[0])
    assert act.item() > 0 and mask_loss.item() > 0
