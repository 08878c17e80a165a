"""tools/linearize.py on teachers the audit found it could not take, or took wrongly:

* an MAE fine-tuned (global-pool) file has no final norm: the error told the user to load it
  with ``final_norm=False``, an option the tool did not have; the final norm is now read from
  the file, as the tokens are.
* a linearized student passed as the teacher ended in a 20-line traceback; now the tool's
  one-line ``error:``, saying the teacher must hold softmax weights.
* MHLA / TTT students from a register-token teacher kept the registers, against the paper
  setting the tool gives them; now dropped with a warning (``--student-reg-tokens`` keeps
  them).
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from mmlinvit.backbones import VisionTransformer

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOL = osp.join(REPO, 'tools', 'linearize.py')
ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
ARCH_ARG = json.dumps(ARCH)


def _run(args):
    return subprocess.run([sys.executable, TOOL] + args, capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS='1'))


def _student(path):
    ckpt = torch.load(path, weights_only=True)
    model = VisionTransformer(**ckpt['meta']['student_cfg'])
    model.load_state_dict(ckpt['state_dict'], strict=True)
    return model, ckpt


def test_a_teacher_without_final_norm_is_linearized(tmp_path):
    teacher = VisionTransformer(ARCH, family='mae', img_size=32, final_norm=False)
    assert not any(k.startswith('norm.') for k in teacher.state_dict())
    src = str(tmp_path / 'mae_ft.pth')
    torch.save(teacher.state_dict(), src)
    out = str(tmp_path / 'student.pth')
    proc = _run([src, out, '--arch', ARCH_ARG, '--family', 'mae', '--operator', 'elu'])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'final_norm=False' in proc.stderr
    student, ckpt = _student(out)
    assert ckpt['meta']['student_cfg']['final_norm'] is False
    assert torch.equal(student.blocks[0].mlp.fc1.weight, teacher.blocks[0].mlp.fc1.weight)


def test_a_linearized_student_as_the_teacher_is_an_error_line(tmp_path):
    src = str(tmp_path / 'elu_student.pth')
    torch.save(VisionTransformer(ARCH, img_size=32, attn_cfg='elu').state_dict(), src)
    out = str(tmp_path / 'out.pth')
    proc = _run([src, out, '--arch', ARCH_ARG, '--operator', 'relu'])
    assert proc.returncode == 1, proc.stderr
    assert 'Traceback' not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
    assert 'softmax' in lines[0] and "'elu'" in lines[0]
    assert not osp.exists(out)


@pytest.mark.filterwarnings('ignore:attention operator')
@pytest.mark.parametrize('operator', ['mhla'])
def test_register_teacher_mhla_student_takes_the_paper_setting(tmp_path, operator):
    teacher = VisionTransformer(ARCH, family='dinov2', img_size=28, patch_size=14,
                                num_reg_tokens=4)
    src = str(tmp_path / 'dinov2_reg.pth')
    torch.save(teacher.state_dict(), src)
    out = str(tmp_path / 'student.pth')
    proc = _run([src, out, '--arch', ARCH_ARG, '--family', 'dinov2', '--operator', operator])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'num_reg_tokens=0' in proc.stderr and '--student-reg-tokens 4' in proc.stderr
    student, ckpt = _student(out)
    assert student.num_reg_tokens == 0 and student.num_prefix_tokens == 0
    assert 'reg_token' not in ckpt['state_dict']
    assert student.pos_interp == teacher.pos_interp  # the family default follows registers

    kept = str(tmp_path / 'kept.pth')
    proc = _run([src, kept, '--arch', ARCH_ARG, '--family', 'dinov2', '--operator', operator,
                 '--student-reg-tokens', '4'])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _student(kept)[0].num_reg_tokens == 4
