"""Recorders record what their options select (``output_index``, ``arg_index``), and teacher
forcing gives each student block the batch's (h, w) grid on non-square images (InLine's local
branch reads the grid: a transposed one mixes the wrong neighbours)."""
import torch
import torch.nn as nn

from mmlinvit.backbones import VisionTransformer
from mmlinvit.distill import ModuleInputsRecorder, ModuleOutputsRecorder, TeacherForcing


class _Pair(nn.Module):

    def forward(self, x: torch.Tensor):
        return x + 1, x * 10


class _Pairs(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Pair(), _Pair()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)[0]
        return x


class _Add(nn.Module):

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class _UsesAdd(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.add = _Add()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(x, x * 7)


def test_output_index_selects_the_element():
    net, x = _Pairs(), torch.arange(3.)
    with ModuleOutputsRecorder('blocks.{i}', output_index=1).attach(net) as recorder:
        net(x)
        got = recorder.get()
    torch.testing.assert_close(got[0], x * 10)
    torch.testing.assert_close(got[1], (x + 1) * 10)
    with ModuleOutputsRecorder('blocks.0', output_index=0).attach(net) as recorder:
        net(x)
        torch.testing.assert_close(recorder.get(), x + 1)


def test_arg_index_selects_the_argument():
    net, x = _UsesAdd(), torch.arange(3.)
    with ModuleInputsRecorder('add', arg_index=1).attach(net) as recorder:
        net(x)
        torch.testing.assert_close(recorder.get(), x * 7)
    with ModuleInputsRecorder('add').attach(net) as recorder:
        net(x)
        torch.testing.assert_close(recorder.get(), x)


def _vit(**kwargs) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(arch=dict(embed_dims=16, num_layers=2, num_heads=2,
                                       mlp_hidden_dims=32),
                             patch_size=4, img_size=16, out_type='raw', **kwargs)


def test_forced_student_blocks_run_on_the_batch_grid_for_non_square_images():
    student = _vit(attn_cfg=dict(type='inline', local_residual=True))
    teacher = _vit()
    forcing = TeacherForcing.from_config(dict(input_recorder='block_in'))
    outputs = ModuleOutputsRecorder('blocks.{i}.attn').attach(student)
    with ModuleInputsRecorder('blocks.{i}').attach(teacher) as block_in:
        forcing.check(student, teacher, dict(block_in=block_in, attn_out=outputs))
        images = torch.randn(2, 3, 8, 24)  # grid (2, 6)
        outputs.enabled = True
        with torch.no_grad():
            teacher(images)
            inputs = block_in.get()
            forcing.forward_student(student, block_in, images)
        recorded = outputs.get()
    outputs.detach()
    for i, x in enumerate(inputs):
        block = student.blocks[i]
        with torch.no_grad():
            expected = block.attn(block.norm1(x), (2, 6), student.num_prefix_tokens)
        torch.testing.assert_close(recorded[i], expected, rtol=0, atol=0)
