"""Mutation round 18: the Mamba-2 mixer, the kernel linear-attention operators, the feature
maps, ``FeatureMSELoss``, ``SyncNormStatsHook``, the training-record helpers and
``ExportStudentHook``.

Each test below failed on at least one single-line change of
``mmlinvit/layers/mamba2.py``, ``mmlinvit/layers/attention/kernel_linear.py``,
``mmlinvit/ops/feature_maps.py``, ``mmlinvit/distill/losses/feature_mse.py``,
``mmlinvit/engine/hooks/sync_norm_stats_hook.py``, ``mmlinvit/backbones/training_record.py``
or ``mmlinvit/engine/hooks/export_student_hook.py`` that the rest of the suite (rounds 8-17
included) let pass.  References, all independent of the code under test:

* the mixer: state-spaces/mamba semantics (``ssd_minimal.py`` recurrence, causal depthwise
  conv, SiLU) written here as a float64 loop, and the documented precision contract (under
  autocast xBC is convolved in fp32 and rounded once after the SiLU), the documented
  in-place work without autograd, the input check;
* kernel attention: A_ij = phi(q_i).phi(k_j) / (sum_l phi(q_i).phi(k_l) + N eps) written in
  float64 with the documented default eps, Hedgehog's map in fp32 under autocast;
* the loss: the mean squared error written out, with the documented defaults;
* the hooks: mmengine's real ``Runner`` / ``CheckpointHook`` file names and the documented
  behaviour (atomic write, main process only, the log line).
"""
import logging
import os
import types
from typing import List, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmlinvit.layers import mamba2 as mamba2_module
from mmlinvit.layers.mamba2 import Mamba2Mixer

from call_spy import CallSpy

pytestmark = pytest.mark.usefixtures('one_thread')


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randomise(module: nn.Module, seed: int, std: float = 0.3) -> None:
    g = _gen(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)


# =========================================================================== Mamba2Mixer
def _xbc_after_silu64(mixer: Mamba2Mixer, u: torch.Tensor) -> torch.Tensor:
    """silu(causal depthwise conv(in_proj_xBC(u))) in float64 (Mamba-2: left pad K - 1)."""
    rows = (mixer.d_inner, mixer.d_inner + 2 * mixer.ngroups * mixer.d_state, mixer.nheads)
    w_xbc = torch.split(mixer.in_proj.weight.double(), rows)[1]
    xbc = u.double() @ w_xbc.T
    weight = mixer.conv1d.weight.double()[:, 0]  # (conv_dim, K)
    taps = weight.shape[-1]
    padded = F.pad(xbc, (0, 0, taps - 1, 0))
    conv = mixer.conv1d.bias.double() + sum(weight[:, k] * padded[:, k:k + u.shape[1]]
                                            for k in range(taps))
    return F.silu(conv)


def test_autocast_rounds_xbc_to_the_autocast_dtype_once_after_the_silu(monkeypatch) -> None:
    """Under autocast xBC is convolved in fp32 and rounded once after the SiLU to the autocast
    dtype (``conv_input`` docstring, the official ``causal_conv1d`` precision): the scan gets
    bf16 x / B / C equal to the float64 silu(conv) to bf16 rounding (mutant: the fp32 xBC went
    to the scan un-rounded)."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4)
    _randomise(mixer, 4)
    u = torch.randn(2, 6, 8, generator=_gen(5))
    spy = CallSpy(mamba2_module.ssd_scan)
    monkeypatch.setattr(mamba2_module, 'ssd_scan', spy)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        mixer(u)
    x, _, _, b, c = spy.calls[0][0][:5]
    assert (x.dtype, b.dtype, c.dtype) == (torch.bfloat16, ) * 3
    # in_proj itself runs in bf16 under autocast: the reference takes bf16-rounded u / weights
    with torch.no_grad():
        ref_mixer = Mamba2Mixer(8, d_state=2, headdim=4)
        ref_mixer.load_state_dict(mixer.state_dict())
        ref_mixer.in_proj.weight.copy_(mixer.in_proj.weight.bfloat16().float())
        want = _xbc_after_silu64(ref_mixer, u.bfloat16().float())
    got = torch.cat([x.reshape(2, 6, -1), b.reshape(2, 6, -1), c.reshape(2, 6, -1)], -1)
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=1e-2)


def test_forward_without_autograd_lets_the_gated_norm_work_in_place(monkeypatch) -> None:
    """``forward`` docstring: without autograd the gated norm runs in place on the call's own
    buffers (``consume=True``); under autograd it must not (mutant: ``consume`` never set)."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4)
    seen: List[bool] = []
    original = type(mixer.norm).forward

    def spy(self, x, z=None, consume: bool = False):
        seen.append(consume)
        return original(self, x, z, consume=consume)

    monkeypatch.setattr(type(mixer.norm), 'forward', spy)
    u = torch.randn(1, 5, 8, generator=_gen(0))
    with torch.no_grad():
        mixer(u)
    mixer(u)
    assert seen == [True, False]


@pytest.mark.parametrize('shape', [(5, 8), (1, 2, 5, 8)])
def test_mixer_names_a_token_tensor_of_the_wrong_rank(shape: Tuple[int, ...]) -> None:
    """(L, C) or 4-d inputs are refused with the expected layout named (mutant: only the width
    was checked, and a bare "not enough values to unpack" came from the shape unpacking)."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4)
    with pytest.raises(ValueError, match=r'Mamba2Mixer expects \(batch, L, 8\)'):
        mixer(torch.randn(*shape))



class _ReportsCuda(torch.Tensor):
    """A CPU tensor that says it lives on ``cuda:0``: runs the accelerator branch of
    :meth:`Mamba2Mixer.conv_input` (bmm + ``nn.Conv1d``) on a machine without GPU."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device('cuda', 0)


def test_accelerator_conv_of_a_16bit_xbc_runs_with_the_fp32_weights() -> None:
    """A bf16 ``in_proj`` (bf16 xBC) with the fp32 ``conv1d`` (the official ``causal_conv1d``
    precision, ``conv_input`` docstring): the convolution runs in fp32 and returns fp32 values
    equal to the float64 causal conv of the bf16 xBC (mutant: xBC kept its bf16 dtype and
    ``nn.Conv1d`` refused the fp32 weight)."""
    mixer = Mamba2Mixer(8, d_state=2, headdim=4)
    _randomise(mixer, 6)
    mixer.in_proj.to(torch.bfloat16)
    u = torch.randn(2, 7, 8, generator=_gen(7)).bfloat16()
    with torch.no_grad():
        got = mixer.conv_input(u.as_subclass(_ReportsCuda)).as_subclass(torch.Tensor)
        rows = (mixer.d_inner, mixer.d_inner + 2 * mixer.ngroups * mixer.d_state,
                mixer.nheads)
        xbc = torch.bmm(torch.split(mixer.in_proj.weight, rows)[1].expand(2, -1, -1),
                        u.transpose(1, 2)).transpose(1, 2).double()  # the bf16 xBC
        weight = mixer.conv1d.weight.double()[:, 0]
        taps = weight.shape[-1]
        padded = F.pad(xbc, (0, 0, taps - 1, 0))
        want = mixer.conv1d.bias.double() + sum(weight[:, k] * padded[:, k:k + 7]
                                                for k in range(taps))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_explicit_auto_scan_backend_is_accepted_by_the_mixer() -> None:
    """``ssd_backend='auto'`` is documented as the auto choice (``None`` = auto, ``'auto'``
    accepted by ``ssd_scan``): the mixer builds with it and computes what the default mixer
    computes (mutant: the mixer's own check refused ``'auto'``)."""
    auto = Mamba2Mixer(8, d_state=2, headdim=4, ssd_backend='auto')
    torch_mixer = Mamba2Mixer(8, d_state=2, headdim=4, ssd_backend='torch')
    torch_mixer.load_state_dict(auto.state_dict())
    u = torch.randn(1, 5, 8, generator=_gen(0))
    with torch.no_grad():
        torch.testing.assert_close(auto(u), torch_mixer(u))

# =========================================================================== kernel operators
def test_kernel_operator_class_defaults_to_eps_one_in_a_million() -> None:
    """``KernelLinearAttention`` built directly (not through the registry's fixed-map classes)
    has the documented eps 1e-6: ReLU features 1e-3 on d = 4 channels and N = 3 tokens give
    A_ij = 4e-6 / (3 * 4e-6 + 3 * 1e-6) = 4 / 15 (module docstring formula), and the mixed
    output of all-ones values is the row sum 0.8 (mutant: the class default was 1e-5)."""
    from mmlinvit.layers.attention.kernel_linear import KernelLinearAttention
    op = KernelLinearAttention(8, 2, feature_map='relu', backend='torch')
    q = torch.full((1, 2, 3, 4), 1e-3, dtype=torch.float64)
    k = q.clone()
    want = torch.full((1, 2, 3, 3), 4.0 / 15.0, dtype=torch.float64)
    torch.testing.assert_close(op.map_from_qk(q, k, None, 0).double(), want, rtol=1e-5, atol=0)
    out = op.mix(q.float(), k.float(), torch.ones(1, 2, 3, 4), None, 0)
    torch.testing.assert_close(out.double(), torch.full((1, 2, 3, 4), 0.8, dtype=torch.float64),
                               rtol=1e-5, atol=0)



def test_hedgehog_defaults_are_the_released_lolcats_feature_map() -> None:
    """A Hedgehog operator built without options has LoLCATS' released ``feature_dim: 64``
    map per head and the identity init equal to the official ``FeatureMapMLP(zero_init=True)``
    weight of the golden file (mutant: a default of 32 features)."""
    from mmlinvit.layers.attention import build_attention_operator
    from official_golden import load_golden
    golden = load_golden('hedgehog_mimetic_official_reference.pt')['hedgehog']
    config = golden['config']
    op = build_attention_operator('hedgehog', config['embed_dims'], config['num_heads'])
    official = golden['untied']['state_dict']
    assert op.feature_q.shape == official['feature_map_q.mlp.layer'].shape
    assert op.feature_k.shape == official['feature_map_k.mlp.layer'].shape
    torch.testing.assert_close(op.feature_q.double(), golden['init']['zero_init_f64'].double())


def test_identity_operator_map_uses_the_operators_eps() -> None:
    """Identity map: A_ij = (q_i . k_j / N) / safe(q_i . kbar), safe(t) = t + eps sign(t)
    (sign(0) = +1), with the operator's ``eps`` (0.5 here: visible), one row of each sign
    (mutant: the map used the default 1e-6 while ``mix`` used the operator's eps)."""
    from mmlinvit.layers.attention import build_attention_operator
    op = build_attention_operator(dict(type='identity', eps=0.5), 8, 2)
    q = torch.randn(1, 2, 4, 4, generator=_gen(3), dtype=torch.float64)
    k = torch.randn(1, 2, 5, 4, generator=_gen(4), dtype=torch.float64) + 0.5
    q[..., 0, :] = k.mean(-2)  # den > 0
    q[..., 1, :] = -k.mean(-2)  # den < 0
    scores = q @ k.transpose(-2, -1)
    den = scores.mean(-1, keepdim=True)
    want = scores / 5 / (den + 0.5 * torch.where(den >= 0, 1.0, -1.0))
    torch.testing.assert_close(op.map_from_qk(q, k, None, 0).double(), want, rtol=1e-5,
                               atol=1e-6)

# =========================================================================== feature maps
def test_hedgehog_feature_is_fp32_under_cpu_autocast() -> None:
    """Hedgehog's logits are computed in fp32 even inside ``torch.autocast`` (docstring:
    "fp32 logits under AMP too"): equal to the float64 formula [softmax(xW), softmax(-xW)]
    to fp32 precision (mutant: the autocast guard removed, bf16 logits were off by ~1e-2)."""
    from mmlinvit.ops.feature_maps import hedgehog_feature
    x = torch.randn(2, 2, 5, 8, generator=_gen(0)) * 2
    w = torch.randn(2, 8, 6, generator=_gen(1))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        got = hedgehog_feature(x, w)
    logits = x.double() @ w.double()
    want = torch.cat([logits.softmax(-1), (-logits).softmax(-1)], dim=-1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


# =========================================================================== ExportStudentHook
class _Student(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _toy_distill_model() -> nn.Module:
    """A tiny mmengine ``BaseModel`` with the ``student_backbone()`` of a DistillationModel
    (mmengine imported here, at test time)."""
    from mmengine.model import BaseModel

    class ToyDistill(BaseModel):
        """A distillation model: ``student`` is the backbone; ``student_neck`` shares the
        name's start (its keys must not be exported)."""

        def __init__(self) -> None:
            super().__init__()
            self.student = _Student()
            self.student_neck = nn.Linear(1, 1)
            self.teacher = nn.Linear(2, 1)

        def student_backbone(self) -> nn.Module:
            return self.student

        def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
            out = self.student_neck(self.student(inputs)) + 0 * self.teacher(inputs)
            return dict(loss=out.pow(2).mean()) if mode == 'loss' else out

    return ToyDistill()


class _Points(torch.utils.data.Dataset):

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> dict:
        return dict(inputs=torch.tensor([float(index), 1.0]))


def test_export_follows_the_epoch_checkpoints_of_a_real_runner(tmp_path) -> None:
    """An epoch-based mmengine run with ``CheckpointHook(interval=1)`` writes ``epoch_1.pth``
    and ``epoch_2.pth``; the hook with a ``{}`` template and its default ``by_epoch`` writes
    one export per checkpoint, named alike, holding exactly the student's entries of that
    checkpoint (no ``student_neck`` / teacher keys) and leaving no temporary file (mutants:
    ``by_epoch`` default False named them ``iter_2`` / ``iter_4``; the prefix without its dot
    took ``student_neck``; the temporary file was left beside the export)."""
    from mmengine.runner import Runner

    from mmlinvit.engine.hooks import ExportStudentHook
    runner = Runner(
        model=_toy_distill_model(), work_dir=str(tmp_path),
        train_dataloader=dict(dataset=_Points(), batch_size=1, num_workers=0,
                              sampler=dict(type='DefaultSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1),
                           logger=None),
        custom_hooks=[ExportStudentHook('student_{}.pth')], default_scope='mmengine',
        log_level='WARNING', experiment_name=f'round18_export_{tmp_path.name}')
    runner.train()
    files = sorted(name for name in os.listdir(tmp_path) if name.endswith(('.pth', '.tmp')))
    assert files == ['epoch_1.pth', 'epoch_2.pth', 'student_epoch_1.pth',
                     'student_epoch_2.pth']
    for epoch in (1, 2):
        checkpoint = torch.load(tmp_path / f'epoch_{epoch}.pth', map_location='cpu',
                                weights_only=False)['state_dict']
        exported = torch.load(tmp_path / f'student_epoch_{epoch}.pth', weights_only=True)
        assert sorted(exported) == ['fc.bias', 'fc.weight']
        for key, value in exported.items():
            assert torch.equal(value, checkpoint[f'student.{key}'])
    # the weights moved between the two epochs: each export is its own checkpoint's
    first = torch.load(tmp_path / 'student_epoch_1.pth', weights_only=True)
    assert not torch.equal(first['fc.weight'], exported['fc.weight'])


def _export_once(tmp_path, **hook_kwargs) -> None:
    from mmlinvit.engine.hooks import ExportStudentHook
    model = _toy_distill_model()
    runner = types.SimpleNamespace(model=model, work_dir=str(tmp_path))
    ExportStudentHook(**hook_kwargs).before_save_checkpoint(
        runner, dict(meta=dict(epoch=3, iter=12), state_dict=model.state_dict()))


def test_export_is_written_by_the_main_process_only(tmp_path, monkeypatch) -> None:
    """Every process calls the hook; only the main one writes (mutant: every rank wrote the
    same file concurrently)."""
    from mmlinvit.engine.hooks import export_student_hook
    monkeypatch.setattr(export_student_hook, 'is_main_process', lambda: False)
    _export_once(tmp_path)
    assert os.listdir(tmp_path) == []


def test_export_names_its_file_in_the_log(tmp_path) -> None:
    """The export is logged with the checkpoint's tag and the file path (mutant: silent)."""
    from mmengine.logging import MMLogger
    messages: List[str] = []

    class _Capture(logging.Handler):

        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = MMLogger.get_current_instance()
    handler = _Capture(logging.INFO)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        _export_once(tmp_path, filename_tmpl='s_{}.pth', by_epoch=False)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    path = os.path.join(str(tmp_path), 's_iter_12.pth')
    assert f'Exported the student backbone (iter_12) to {path}' in messages


def test_export_refuses_a_model_whose_student_backbone_is_not_callable(tmp_path) -> None:
    """``student_backbone`` must be the DistillationModel method: an attribute of that name
    that is not callable gets the hook's own error (mutant: ``hasattr`` let it through to a
    bare "'NoneType' object is not callable")."""
    from mmlinvit.engine.hooks import ExportStudentHook
    model = nn.Linear(2, 2)
    model.student_backbone = None
    runner = types.SimpleNamespace(model=model, work_dir=str(tmp_path))
    with pytest.raises(TypeError, match='ExportStudentHook needs a mmlinvit.DistillationModel'):
        ExportStudentHook().before_save_checkpoint(
            runner, dict(meta=dict(epoch=1, iter=1), state_dict=model.state_dict()))


# =========================================================================== training records
def test_names_are_encoded_as_32_zero_padded_ascii_bytes() -> None:
    """The checkpoint format of a name record: one row of 32 bytes per name, the ASCII codes
    then zeros; a 32-character name fits exactly, 33 do not (mutants: 24-byte rows, which
    refuse every record saved so far; ``>=`` refusing a 32-character name)."""
    from mmlinvit.backbones.training_record import decode_names, encode_names
    want = torch.tensor([[101, 108, 117] + [0] * 29,
                         [ord('x')] * 32], dtype=torch.uint8)
    got = encode_names(['elu', 'x' * 32])
    assert got.dtype == torch.uint8
    assert torch.equal(got, want)
    assert decode_names(want) == ['elu', 'x' * 32]
    with pytest.raises(ValueError, match='longer than the 32 bytes'):
        encode_names(['x' * 33])


def test_block_ranges_keep_single_blocks_inside_the_list() -> None:
    """``describe_blocks`` joins runs of consecutive indices: a lone block in the middle is its
    own number, not ``'1-1'`` (mutant: ``len(run) >= 1`` inside the loop)."""
    from mmlinvit.backbones.training_record import describe_blocks
    assert describe_blocks([1, 3, 4, 6]) == '1, 3-4, 6'
    assert describe_blocks([]) == ''


def test_records_written_in_the_saved_format_load_strictly() -> None:
    """Checkpoints saved so far hold ``block_operators`` / ``mlp_act`` as rows of 32 and
    ``operator_settings`` as rows of 128 zero-padded ASCII bytes (the format constants'
    docs); records written here byte by byte in that format load strictly into a ViT with
    the same operators (mutants: 24-byte names or 96-byte settings rows made every saved
    checkpoint a size mismatch)."""
    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.backbones.training_record import decode_names

    def rows(names: List[str], width: int) -> torch.Tensor:
        return torch.tensor([list(name.encode('ascii').ljust(width, b'\0')) for name in names],
                            dtype=torch.uint8)

    def build() -> VisionTransformer:
        return VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                           mlp_hidden_dims=64),
                                 img_size=32, patch_size=16, attn_cfg=dict(type='relu'))

    state = build().state_dict()
    state['block_operators'] = rows(['relu', 'relu'], 32)
    # 'name=value' with the value's repr: ReLU attention records its eps (1e-6 by default)
    state['operator_settings'] = rows(['eps=1e-06', 'eps=1e-06'], 128)
    state['mlp_act'] = rows(decode_names(state['mlp_act']), 32)
    build().load_state_dict(state, strict=True)


# =========================================================================== FeatureMSELoss
def test_feature_mse_default_layouts_have_no_special_tokens() -> None:
    """With ``patch_tokens_only=True`` and no layouts given, both sides default to ``(0, 0)``
    special tokens: every token is a patch token and the loss is the plain MSE over all of
    them, written out here (mutants: a default prefix of one token on either side)."""
    from mmlinvit.distill.losses.feature_mse import FeatureMSELoss
    student = torch.randn(2, 5, 3, generator=_gen(0))
    teacher = torch.randn(2, 5, 3, generator=_gen(1))
    loss = FeatureMSELoss(patch_tokens_only=True)(student, teacher)
    want = ((student.double() - teacher.double())**2).mean()
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize('template', ['student_{epoch}.pth', 'student_{}_{}.pth', 'student_{.pth'])
def test_export_refuses_a_bad_file_name_template_when_built(template: str) -> None:
    """FINDING (fails on the original ``export_student_hook.py``): a template that
    ``str.format`` cannot fill with the one tag (a named field, two fields, a lone brace) was
    accepted and failed at the first checkpoint, after a whole epoch of training, with a bare
    ``KeyError: 'epoch'`` / ``IndexError`` / ``ValueError`` from ``before_save_checkpoint``;
    it is refused when the hook is built, naming the option."""
    from mmlinvit.engine.hooks import ExportStudentHook
    with pytest.raises(ValueError, match='ExportStudentHook: filename_tmpl'):
        ExportStudentHook(template)
