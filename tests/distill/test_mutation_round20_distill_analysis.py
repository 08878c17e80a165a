"""Mutation round 20: recorders, patch masking, teacher forcing, distillation terms, attention
maps and layer sensitivity, on branches, defaults and error paths the rest of the suite let
through.

Each test below failed on at least one single-line change of its module that every other test
passed.  Guarded here, each against an expectation written in the test (values by hand, own
hooks, the softmax attention recomputed in float64 from the block's own weights, mmengine's
``BaseModel.parse_losses``, ``torch.utils.checkpoint`` semantics):

* :mod:`mmlinvit.analysis.attention_maps`: the query row of the softmax map against a float64
  softmax written here (prefix and register tokens, row-major grid, head mean and one head);
  an operator called with keywords, without the prefix count (0 then) or without a grid (the
  named error); Adventurer similarity maps on the corner-padded grid of a non-divisible image;
* :mod:`mmlinvit.distill.recorders`: ``output_index`` on a list output; an ``output_index``
  recorder that is off does not look at the output; messages name the recorder given at
  ``attach`` (kept by a later ``attach``) or its source;
* :mod:`mmlinvit.distill.patch_masking`: the ``repr`` of a run seed; a student without
  ``patch_size``, or whose own mask token is a buffer or missing;
* :mod:`mmlinvit.distill.teacher_forcing`: a ``with_cp`` student recomputes the forced branch
  in backward with the same ``with_layer_scale``; the prefix tokens and patch size of a
  task-model teacher's backbone must be the student's;
* :mod:`mmlinvit.models.distill.terms`: a loss's ``TypeError`` in the dry run is the named
  config error; non-finite checks follow mmengine's loss keys; tuples in ``describe_value``;
* :mod:`mmlinvit.analysis.layer_sensitivity`: hybrid clones ignore the config's
  ``pretrained``; Stage 1 runs the aligned block in training mode, passes a grid operator the
  class-token count, and leaves the student in eval; costs are timed in eval mode; report
  tables have one delimiter cell per header cell (GitHub-flavoured Markdown).

Findings of this round (each test failed on the code before its fix):
``sample_patch_mask`` did not check its ratio, so a negative one silently masked
``N - |count|`` patches (ratio -0.5 masked 2 of 4) and NaN raised a bare ``ValueError``; a
recorder template over blocks of which one lacks the module (a hybrid model) recorded the
blocks before the gap only, without a word.
"""
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
import torch
import torch.nn as nn

from mmlinvit.analysis import capture_attention_inputs, query_attention_maps
from mmlinvit.distill.patch_masking import PatchMasking, sample_patch_mask
from mmlinvit.distill.recorders import ModuleInputsRecorder, ModuleOutputsRecorder
from mmlinvit.distill.teacher_forcing import TeacherForcing
from mmlinvit.models.distill import DistillationConfigError
from mmlinvit.models.distill.input_specs import InputSpec
from mmlinvit.models.distill.terms import check_finite_losses, compute_terms, describe_value
from mmlinvit.backbones import VisionTransformer
from mmlinvit.layers.attention.base import build_attention_operator

ROOT = Path(__file__).resolve().parents[2]
ADVENTURER_EXISTS = (ROOT / 'mmlinvit/backbones/adventurer.py').exists()
TINY = dict(embed_dims=16, num_layers=2, num_heads=2, mlp_hidden_dims=32)


# ------------------------------------------------------------------------------ attention maps
def _softmax_rows_float64(block: nn.Module, block_input: torch.Tensor,
                          num_heads: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) in float64 from the block's LayerNorm and qkv weights:
    (B, H, N, N), written out (no operator code)."""
    x = block_input.double()
    ln = block.norm1
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)
    x = (x - mean) / torch.sqrt(var + ln.eps) * ln.weight.double() + ln.bias.double()
    qkv = block.attn.qkv
    proj = x @ qkv.weight.double().T + qkv.bias.double()
    b, n, three_c = proj.shape
    c = three_c // 3
    d = c // num_heads
    q = proj[..., :c].reshape(b, n, num_heads, d).transpose(1, 2)
    k = proj[..., c:2 * c].reshape(b, n, num_heads, d).transpose(1, 2)
    return torch.softmax(q @ k.transpose(-2, -1) / d**0.5, dim=-1)


def _block_inputs(model: nn.Module, images: torch.Tensor, layer: int) -> torch.Tensor:
    """The input of ``model.blocks[layer]``, taken with a hook written here."""
    seen = {}
    handle = model.blocks[layer].register_forward_pre_hook(
        lambda module, args: seen.setdefault('x', args[0].detach()))
    try:
        with torch.no_grad():
            model(images)
    finally:
        handle.remove()
    return seen['x']


@pytest.mark.parametrize('num_reg_tokens', [0, 2])
def test_query_map_is_the_float64_softmax_row_on_the_grid(num_reg_tokens: int):
    """A 3 x 5 grid (24 x 40 images, patch 8), a class token and 0 / 2 registers: the map of
    query (2, 1) is row ``prefix + 2 * 5 + 1`` of the softmax, columns ``prefix:`` in raster
    order, averaged over the heads (or head 1 alone)."""
    torch.manual_seed(3)
    model = VisionTransformer(TINY, attn_cfg='softmax', img_size=(24, 40), patch_size=8,
                              num_reg_tokens=num_reg_tokens).eval()
    images = torch.randn(2, 3, 24, 40)
    prefix = 1 + num_reg_tokens
    probs = _softmax_rows_float64(model.blocks[1], _block_inputs(model, images, 1), 2)
    row = probs[:, :, prefix + 2 * 5 + 1, prefix:]  # (B, H, 15)
    maps = query_attention_maps(model, images, (2, 1), [1])
    assert maps[1].dtype == torch.float32 and maps[1].shape == (2, 3, 5)
    torch.testing.assert_close(maps[1].double(), row.mean(1).reshape(2, 3, 5), rtol=1e-5,
                               atol=1e-6)
    head1 = query_attention_maps(model, images, (2, 1), [-1], head=1)[1]
    torch.testing.assert_close(head1.double(), row[:, 1].reshape(2, 3, 5), rtol=1e-5, atol=1e-6)


class _KeywordBlock(nn.Module):
    """A block calling its operator with keywords, or without the prefix count."""

    def __init__(self, keywords: bool) -> None:
        super().__init__()
        self.attn = build_attention_operator('softmax', 8, 2)
        self.keywords = keywords

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int], prefix: int) -> torch.Tensor:
        if self.keywords:
            return x + self.attn(x, hw_shape=hw_shape, num_prefix_tokens=prefix)
        return x + self.attn(x, hw_shape)  # no prefix token: the operator's default 0


class _KeywordModel(nn.Module):
    """(B, N, 8) tokens in, a ViT-like ``blocks`` list: 1 prefix token for block 0 (keyword
    call), none for block 1 (positional call without the count)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_KeywordBlock(True), _KeywordBlock(False)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](x, (2, 3), 1)
        return self.blocks[1](x[:, 1:], (2, 3), 0)


def test_operator_inputs_given_as_keywords_or_left_to_their_defaults():
    """The captured arguments are those of the call however given: hw_shape and the prefix
    count as keywords; without the count the operator's default, 0 prefix tokens."""
    torch.manual_seed(0)
    model = _KeywordModel().eval()
    tokens = torch.randn(1, 7, 8)
    captured = capture_attention_inputs(model, tokens, [0, 1])
    assert captured[0][1:] == ((2, 3), 1)
    assert captured[1][1:] == ((2, 3), 0)
    torch.testing.assert_close(captured[0][0], tokens)
    maps = query_attention_maps(model, tokens, (1, 2), [0, 1])
    for layer, prefix in ((0, 1), (1, 0)):
        x = captured[layer][0]
        full = model.blocks[layer].attn.attention_map(x, (2, 3), prefix).mean(1)
        expected = full[:, prefix + 5, prefix:].reshape(1, 2, 3)
        torch.testing.assert_close(maps[layer], expected)
        assert maps[layer].shape == (1, 2, 3)


class _NoGridBlock(nn.Module):
    """A block calling its operator with the tokens alone (no patch grid)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = build_attention_operator('softmax', 8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x)


class _NoGridModel(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_NoGridBlock()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](x)


def test_an_operator_called_without_a_grid_is_named():
    """Without ``hw_shape`` the query cannot be placed: the ValueError says so (not a
    TypeError from ``tuple(None)``)."""
    model = _NoGridModel()
    with pytest.raises(ValueError, match='called without hw_shape'):
        query_attention_maps(model, torch.randn(1, 4, 8), (0, 0), [0])


# ---------------------------------------------------------------------------------- recorders
class _ListOut(nn.Module):
    """Returns a list ``[x + 1, x * 10]``."""

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        return [x + 1, x * 10]


class _TensorOut(nn.Module):

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _holder(child: nn.Module) -> nn.Module:
    model = nn.Sequential()
    model.add_module('op', child)
    return model


def test_output_index_selects_from_a_list_output():
    """A module returning a list is indexed like a tuple (both are sequences of outputs)."""
    model = _holder(_ListOut())
    x = torch.arange(3.0)
    with ModuleOutputsRecorder('op', output_index=1).attach(model) as rec:
        model.op(x)
        torch.testing.assert_close(rec.get(), x * 10)


def test_an_output_index_recorder_that_is_off_ignores_the_output():
    """Attached but not recording (outside its ``with``), an ``output_index`` recorder on a
    tensor-returning module lets plain inference run; recording, it names the mismatch."""
    model = _holder(_TensorOut())
    rec = ModuleOutputsRecorder('op', output_index=0).attach(model)
    try:
        torch.testing.assert_close(model.op(torch.ones(2)), torch.full((2, ), 2.0))
        with rec:
            with pytest.raises(RuntimeError, match='returned a Tensor'):
                model.op(torch.ones(2))
    finally:
        rec.detach()


def test_messages_name_the_recorder_given_at_attach_or_its_source():
    """Without ``where`` the messages say ``recorder '<source>'``; a ``where`` given once is
    kept by a later ``attach`` without one."""
    model = _holder(_TensorOut())
    rec = ModuleOutputsRecorder('op').attach(model)
    with rec:
        with pytest.raises(RuntimeError, match=r"^recorder 'op': module\(s\) \['op'\] did not"):
            rec.get()
    rec.attach(model, where="student recorder 'feat'")
    rec.attach(model)
    with rec:
        with pytest.raises(RuntimeError, match=r"^student recorder 'feat': module\(s\)"):
            rec.get()


def _hybrid_blocks() -> nn.Module:
    """Three blocks; only blocks 0 and 2 have a ``kernel`` (a per-layer operator choice)."""
    blocks = nn.ModuleList()
    for i in range(3):
        block = nn.Module()
        block.attn = nn.Identity()
        if i != 1:
            block.kernel = nn.Linear(2, 2)
        blocks.append(block)
    model = nn.Module()
    model.blocks = blocks
    return model


def test_a_template_over_blocks_with_a_gap_is_refused_not_cut_short() -> None:
    """Found in round 20: ``indices=None`` counted 0, 1, ... up to the first block without the
    module, so blocks 0 and 2 of a hybrid model recorded block 0 only, without a word (and
    ``indices=[2]`` was "out of range" though the module exists). The records pair with the
    other model's by position, so a gap is refused naming the indices that have it; the
    indices listed record exactly those modules."""
    model = _hybrid_blocks()
    with pytest.raises(DistillationConfigError,
                       match=r"exists for indices \[0, 2\] of the 3 'blocks\.\{i\}', not "
                             r"for \[1\]; give indices=\[0, 2\]"):
        ModuleOutputsRecorder('blocks.{i}.kernel').attach(model)
    rec = ModuleOutputsRecorder('blocks.{i}.kernel', indices=[0, -1]).attach(model)
    assert rec.paths == ['blocks.0.kernel', 'blocks.2.kernel']
    with pytest.raises(DistillationConfigError, match=r'index 1 is out of range.*\[0, 2\]'):
        ModuleOutputsRecorder('blocks.{i}.kernel', indices=[1]).attach(model)
    assert ModuleOutputsRecorder('blocks.{i}.attn').attach(model).paths == [
        'blocks.0.attn', 'blocks.1.attn', 'blocks.2.attn']


# ----------------------------------------------------------------------------- patch masking
class _MaskableBackbone(nn.Module):
    """A stand-in backbone with the masked forward patch masking needs."""

    def __init__(self, embed_dims: int = 8, patch_size: Optional[int] = 4,
                 mask_token: Optional[torch.Tensor] = None, as_buffer: bool = False) -> None:
        super().__init__()
        self.embed_dims = embed_dims
        if patch_size is not None:
            self.patch_size = patch_size
        if as_buffer:
            self.register_buffer('mask_token', mask_token)
        else:
            self.mask_token = mask_token

    def forward_tokens(self, x: torch.Tensor, patch_mask: Optional[torch.Tensor] = None,
                       mask_token: Optional[torch.Tensor] = None) -> None:
        pass


def test_repr_marks_a_seed_taken_from_the_run():
    """``seed=None`` reads torch's seed at build time and says so; a fixed seed is plain."""
    assert repr(PatchMasking(ratio=0.5, seed=7)) == (
        'PatchMasking(ratio=0.5, seed=7, use_student_mask_token=False)')
    with torch.random.fork_rng():
        torch.manual_seed(123)
        masking = PatchMasking(ratio=0.5, use_student_mask_token=True)
    assert (masking.seed, masking.seed_from_run) == (123, True)
    assert repr(masking) == ('PatchMasking(ratio=0.5, seed=123 (run seed), '
                             'use_student_mask_token=True)')


def test_the_student_needs_a_patch_size():
    """Without ``patch_size`` the masks' grid is unknown: refused by name."""
    with pytest.raises(DistillationConfigError, match="attribute 'patch_size'"):
        PatchMasking(seed=0).check(_MaskableBackbone(patch_size=None))
    PatchMasking(seed=0).check(_MaskableBackbone())  # control


def test_the_students_own_mask_token_must_be_a_parameter():
    """``use_student_mask_token`` trains the backbone's token: a buffer (never trained) or no
    token is refused; a parameter passes."""
    masking = PatchMasking(seed=0, use_student_mask_token=True)
    with pytest.raises(DistillationConfigError, match='needs a mask_token parameter'):
        masking.check(_MaskableBackbone(mask_token=torch.zeros(1, 8), as_buffer=True))
    with pytest.raises(DistillationConfigError, match='needs a mask_token parameter'):
        masking.check(_MaskableBackbone())
    masking.check(_MaskableBackbone(mask_token=nn.Parameter(torch.zeros(1, 8))))


# --------------------------------------------------------------------------- teacher forcing
class _ForcedBlock(nn.Module):
    """A block whose attention branch is a linear map, counting and recording its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.calls: List[Tuple[int, bool]] = []
        self.outputs: List[torch.Tensor] = []

    def forward_attn(self, x: torch.Tensor, hw_shape: Tuple[int, int], num_prefix_tokens: int,
                     with_layer_scale: bool = False) -> torch.Tensor:
        self.calls.append((num_prefix_tokens, with_layer_scale))
        out = self.lin(x)
        self.outputs.append(out)
        return out


class _ForcedStudent(nn.Module):
    """A bare-backbone stand-in with ``blocks.{i}.forward_attn``."""

    def __init__(self, depth: int = 2, num_prefix_tokens: int = 1, patch_size: int = 4,
                 with_cp: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_ForcedBlock() for _ in range(depth))
        self.num_prefix_tokens = num_prefix_tokens
        self.patch_size = patch_size
        self.with_cp = with_cp


class _Recorded:
    """What a teacher ``ModuleInputs`` recorder on ``blocks.{i}`` holds after a forward."""

    def __init__(self, indices: List[int], inputs: List[torch.Tensor]) -> None:
        self.indices, self._inputs = indices, inputs

    def get(self, where: Optional[str] = None) -> List[torch.Tensor]:
        return self._inputs


@pytest.mark.parametrize('with_layer_scale', [False, True])
def test_a_checkpointed_student_recomputes_the_forced_branch_in_backward(with_layer_scale: bool):
    """``with_cp`` in training: the attention branch runs under ``torch.utils.checkpoint``
    (non-reentrant), so the backward pass runs it a second time, with the same arguments
    (``with_layer_scale`` included); gradients equal those of the plain run."""
    grads = []
    for with_cp in (False, True):
        torch.manual_seed(0)
        student = _ForcedStudent(depth=1, with_cp=with_cp).train()
        x = torch.randn(2, 5, 2)
        forcing = TeacherForcing('block_in', with_layer_scale=with_layer_scale)
        forcing.forward_student(student, _Recorded([0], [x]), torch.zeros(2, 3, 8, 8))
        block = student.blocks[0]
        block.outputs[0].square().sum().backward()
        assert block.calls == [(1, with_layer_scale)] * (2 if with_cp else 1)
        grads.append(block.lin.weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.skipif(not ADVENTURER_EXISTS, reason='Adventurer backbone not present')
def test_adventurer_similarity_maps_cover_the_corner_padded_grid():
    """20 x 28 images at patch 8 are padded to a 3 x 4 grid (ceil): the map has that shape,
    and is the cosine similarity, in float64 here, of the query patch's feature after the
    block (own hook; class token last) to every patch."""
    from mmlinvit.analysis import activation_similarity_maps
    from mmlinvit.backbones.adventurer import Adventurer
    torch.manual_seed(0)
    model = Adventurer(dict(embed_dims=32, num_layers=2), patch_size=8,
                       mixer_cfg=dict(d_state=8, headdim=16)).eval()
    images = torch.randn(1, 3, 20, 28)
    seen = {}
    handle = model.layers[1].register_forward_hook(
        lambda module, args, out: seen.setdefault('out', out.detach()))
    try:
        maps = activation_similarity_maps(model, images, (2, 3), [1])
    finally:
        handle.remove()
    patches = seen['out'][0, :-1].double()
    assert patches.shape[0] == 12
    query = patches[2 * 4 + 3]
    expected = (patches @ query) / (patches.norm(dim=-1) * query.norm())
    assert maps[1].shape == (1, 3, 4)
    torch.testing.assert_close(maps[1][0].double(), expected.reshape(3, 4), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------- distillation terms
class _TypeErrorLoss(nn.Module):

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise TypeError('unsupported operand')


def test_a_type_error_of_a_loss_in_the_dry_run_names_the_shapes():
    specs = [InputSpec('pred', 'student', 'feat'), InputSpec('target', 'teacher', 'feat')]
    with pytest.raises(DistillationConfigError, match=r"'feat' \(_TypeErrorLoss\) does not fit"):
        compute_terms(dict(feat=_TypeErrorLoss()), dict(feat=specs), dict(feat=1.0),
                      lambda s: torch.zeros(2), dry_run_size=(8, 8))


def test_non_finite_checks_follow_mmengines_loss_keys():
    """mmengine's ``BaseModel.parse_losses`` sums every key containing ``'loss'`` (a plain
    ``'loss'`` too), a tensor or a list of tensors: a NaN in any of them stops; other keys are
    not looked at."""
    from mmengine.model import BaseModel
    nan = torch.tensor(float('nan'))
    ok = torch.tensor(1.0)
    for losses in (dict(loss=nan), dict(loss_x=[ok, nan]), dict(loss_y=[nan])):
        total, _ = BaseModel.parse_losses(None, dict(losses))  # the reference: NaN counted
        assert torch.isnan(total)
        with pytest.raises(FloatingPointError):
            check_finite_losses(losses)
    check_finite_losses(dict(acc=nan, loss=ok))


def test_describe_value_of_a_tuple_of_tensors():
    assert describe_value((torch.zeros(2, 3), torch.zeros(2, 3))) == '2 x (2, 3)'


# ------------------------------------------------------------------------- layer sensitivity
def test_hybrid_clones_ignore_the_configs_pretrained_file(tmp_path):
    """``clone_with_attn`` ignores ``type`` and ``pretrained`` of the teacher's backbone config
    (the teacher is loaded already): a checkpoint path that is gone is not read, and the clone
    carries the teacher's weights."""
    from mmlinvit.analysis.layer_sensitivity import clone_with_attn
    cfg = dict(type='VisionTransformer', arch=TINY, img_size=16, patch_size=8,
               pretrained=str(tmp_path / 'gone.pth'))
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, img_size=16, patch_size=8).eval()
    clone = clone_with_attn(cfg, teacher, ['softmax', 'elu'])
    assert clone.pretrained is None and not clone.training
    elu = type(build_attention_operator('elu', 16, 2)).__name__
    assert [type(b.attn).__name__ for b in clone.blocks] == [
        type(teacher.blocks[0].attn).__name__, elu]
    for name in ('blocks.0.attn.qkv.weight', 'blocks.1.mlp.fc1.weight', 'cls_token'):
        torch.testing.assert_close(clone.get_parameter(name), teacher.get_parameter(name),
                                   rtol=0, atol=0)


def test_align_layer_trains_the_aligned_block_in_training_mode():
    """``clone_with_attn`` returns an eval-mode student; Stage 1 on layer 1 runs that block in
    training mode (its dropout as in training; own hook) and leaves the student in eval."""
    from mmlinvit.analysis.layer_sensitivity import align_layer, clone_with_attn
    cfg = dict(type='VisionTransformer', arch=TINY, img_size=16, patch_size=8)
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, img_size=16, patch_size=8).eval().requires_grad_(False)
    student = clone_with_attn(cfg, teacher, ['softmax', 'elu'])
    assert not student.training
    modes = []
    handle = student.blocks[1].attn.register_forward_pre_hook(
        lambda module, args: modes.append(module.training))
    try:
        losses = align_layer(student, teacher, 1, torch.randn(3, 3, 16, 16), iters=2, lr=1e-3,
                             batch_size=2, seed=0)
    finally:
        handle.remove()
    assert len(losses) == 2 and modes == [True, True]
    assert not any(m.training for m in student.modules())


@pytest.mark.filterwarnings('ignore:check_operator_setting=False')
def test_align_layer_gives_a_grid_operator_the_class_token_count():
    """MHLA groups the patch tokens on the grid, so Stage 1 must pass the teacher's prefix
    count: the first step's loss (before any update) is the MSE, computed here with own hooks,
    of the student's attention with 1 prefix token on the teacher's block input."""
    import torch.nn.functional as F
    from mmlinvit.analysis.layer_sensitivity import align_layer, clone_with_attn
    cfg = dict(type='VisionTransformer', arch=dict(TINY, embed_dims=32), family='deit',
               img_size=32, patch_size=8, with_cls_token=True, pos_embed_type='learned',
               out_type='cls_token', check_operator_setting=False)
    torch.manual_seed(0)
    teacher = VisionTransformer(**{k: v for k, v in cfg.items() if k != 'type'}).eval()
    teacher.requires_grad_(False)
    student = clone_with_attn(cfg, teacher, ['softmax', 'mhla'])
    images = torch.randn(1, 3, 32, 32)  # one image: every batch is this image
    seen = {}
    handles = [teacher.blocks[1].register_forward_pre_hook(
        lambda module, args: seen.setdefault('x', args[0].detach())),
        teacher.blocks[1].attn.register_forward_hook(
            lambda module, args, out: seen.setdefault('t', out.detach()))]
    try:
        with torch.no_grad():
            teacher(images)
    finally:
        for handle in handles:
            handle.remove()
    blk = student.blocks[1]
    with torch.no_grad():
        expected = float(F.mse_loss(blk.attn(blk.norm1(seen['x']), (4, 4), 1), seen['t']))
    losses = align_layer(student, teacher, 1, images, iters=1, lr=1e-4, batch_size=1, seed=3)
    assert losses[0] == pytest.approx(expected, rel=1e-5)


def test_report_tables_have_one_delimiter_cell_per_header_cell():
    """GitHub-flavoured Markdown renders a table only when its delimiter row has as many cells
    as the header row: 5 for the sensitivity table, 7 for the proposal table."""
    from mmlinvit.analysis.layer_sensitivity import proposal_table, sensitivity_table
    costs = dict(resolution=[32, 32], teacher_s=0.02, teacher_flops=2e9,
                 blocks=[dict(softmax_s=0.01, linear_s=0.005, softmax_flops=1e9,
                              linear_flops=5e8)])
    sensitivity = [dict(attn_gap_before=0.5, attn_gap=0.25, alignment_kept=True,
                        feature_gap=0.125)]
    proposals = [dict(keep=0, softmax_layers=[], predicted_s=0.015, measured_s=0.01,
                      predicted_flops=1.5e9, feature_gap=0.125)]
    for table, cells in ((sensitivity_table(sensitivity, costs), 5),
                         (proposal_table(proposals, costs), 7)):
        header, delimiter, row = table.splitlines()[:3]
        assert delimiter == '|' + '---|' * cells
        assert header.count('|') == row.count('|') == cells + 1


def test_layer_costs_time_the_teacher_in_eval_mode():
    """Costs are measured on the model as it infers: a teacher handed over in training mode
    runs every timed forward in eval mode (own hook on a block)."""
    from mmlinvit.analysis.layer_sensitivity import layer_costs
    cfg = dict(type='VisionTransformer', arch=TINY, img_size=16, patch_size=8)
    torch.manual_seed(0)
    teacher = VisionTransformer(TINY, img_size=16, patch_size=8).train()
    modes = []
    handle = teacher.blocks[0].register_forward_pre_hook(
        lambda module, args: modes.append(module.training))
    try:
        costs = layer_costs(cfg, teacher, 'elu', (16, 16), repeats=1)
    finally:
        handle.remove()
    assert len(costs['blocks']) == 2 and modes and not any(modes)


@pytest.mark.parametrize('ratio', [-0.5, -1e-9, 1.0, 1.5, float('nan')])
def test_sample_patch_mask_refuses_a_ratio_outside_0_1(ratio: float):
    """FINDING (round 20; fails on the code before the fix): ``sample_patch_mask`` is public
    (``mmlinvit.distill``) but only ``PatchMasking`` checked the ratio.  A negative ratio gave
    ``N - int(N * (1 - ratio)) < 0`` masked patches, and ``argsort()[:, :negative]`` then
    masked ``N - |count|`` of them: ratio -0.5 on 4 patches silently masked 2 (50 %); NaN
    raised a bare ``ValueError`` from ``int(nan)``.  Now the documented range [0, 1) is
    checked with the component's message; ratio 0 still masks nothing."""
    with pytest.raises(DistillationConfigError, match=r'ratio must be in \[0, 1\)'):
        sample_patch_mask(2, 4, ratio, seed=0, step=0)
    assert not sample_patch_mask(2, 4, 0.0, seed=0, step=0).any()


class _TaskModel(nn.Module):
    """A task model (classifier / segmentor) around a backbone."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone


def test_a_task_model_teachers_backbone_is_checked():
    """An ImageClassifier-like teacher has no patch size or prefix count of its own: those of
    its backbone are compared with the student's (recorder on ``backbone.blocks.{i}``)."""

    def check(student: nn.Module, teacher: nn.Module) -> None:
        recorder = ModuleInputsRecorder('backbone.blocks.{i}').attach(teacher)
        try:
            TeacherForcing('block_in').check(student, teacher, dict(block_in=recorder))
        finally:
            recorder.detach()

    with pytest.raises(DistillationConfigError, match="teacher's patch size is 8"):
        check(_ForcedStudent(patch_size=4), _TaskModel(_ForcedStudent(patch_size=8)))
    with pytest.raises(DistillationConfigError, match='carry 2 class / register token'):
        check(_ForcedStudent(num_prefix_tokens=1), _TaskModel(_ForcedStudent(num_prefix_tokens=2)))
    check(_ForcedStudent(), _TaskModel(_ForcedStudent()))
