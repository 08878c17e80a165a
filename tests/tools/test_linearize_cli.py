"""tools/linearize.py: an unknown operator / strategy / arch / family is a one-line ``error:``
listing the registered names (exit status 2), checked before the teacher checkpoint is read."""
import os.path as osp
import subprocess
import sys

import pytest
import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.layers.attention import ATTENTION_OPERATORS
from mmlinvit.transfer import TRANSFER_STRATEGIES

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOL = osp.join(REPO, 'tools', 'linearize.py')
TINY = '{"embed_dims": 32, "num_layers": 2, "num_heads": 2, "mlp_hidden_dims": 64}'


@pytest.fixture(scope='module')
def teacher(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp('lin') / 'teacher.pth')
    model = VisionTransformer(dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64),
                              family='deit', img_size=32)
    torch.save(model.state_dict(), path)
    return path


def _run(args):
    return subprocess.run([sys.executable, TOOL] + args, capture_output=True, text=True,
                          cwd=REPO, env=dict(__import__('os').environ, OMP_NUM_THREADS='1'))


def test_unknown_operator_is_an_error_line(teacher, tmp_path):
    out = str(tmp_path / 's.pth')
    proc = _run([teacher, out, '--arch', TINY, '--operator', 'eluu'])
    assert proc.returncode == 2, proc.stderr
    assert 'Traceback' not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown operator 'eluu'")
    assert all(name in lines[0] for name in ATTENTION_OPERATORS.names)
    assert not osp.exists(out)


@pytest.mark.parametrize('args,expected', [
    (['--operator', 'elu', '--strategy', 'mlpcopy'], "error: unknown strategy 'mlpcopy'"),
    (['--operator-per-layer', 'softmax,relux'],
     "error: unknown operator 'relux' (layer 1 of --operator-per-layer)"),
    (['--operator', '{"type": "nope"}'], "error: unknown operator 'nope'"),
    (['--operator', 'elu', '--arch', 'xl'], "error: unknown arch 'xl'"),
    (['--operator', 'elu', '--family', 'dino'], "error: unknown family 'dino'"),
    (['--operator', 'elu', '--strategy', 'impulse', '--strategy-arg', 'stepz=5'],
     "error: --strategy-arg stepz: not an option of strategy 'impulse'; its options: window, "
     "steps"),
])
def test_unknown_names_in_process(teacher, tmp_path, capsys, args, expected):
    sys.path.insert(0, osp.join(REPO, 'tools'))
    try:
        import linearize
    finally:
        sys.path.pop(0)
    argv = [teacher, str(tmp_path / 's.pth')] + (['--arch', TINY] if '--arch' not in args
                                                  else []) + args
    with pytest.raises(SystemExit) as exc:
        linearize.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(expected), err
    if 'unknown strategy' in expected:
        assert all(name in err for name in TRANSFER_STRATEGIES.names)


def test_registry_message_plural():
    """The registry's own message reads 'strategies' (it said 'strategys')."""
    with pytest.raises(KeyError) as exc:
        TRANSFER_STRATEGIES.get('nope')
    assert 'Registered weight-transfer strategies: ' in str(exc.value)
    assert 'strateg' + 'ys' not in str(exc.value)
    with pytest.raises(KeyError, match='Registered attention operators: '):
        ATTENTION_OPERATORS.get('nope')


@pytest.mark.parametrize('operator', ['mhla', 'ttt'])
def test_mhla_and_ttt_students_take_their_paper_setting(teacher, tmp_path, operator):
    """A class-token DeiT teacher and --operator mhla / ttt without the student flags: a
    traceback whose fix was config syntax before; now the student takes the operators' paper
    setting (no class token, sin-cos positions, average pooling), says so, and the MLPs copy."""
    out = str(tmp_path / f'{operator}.pth')
    proc = _run([teacher, out, '--arch', TINY, '--operator', operator,
                 '--strategy', 'mlp_copy'])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'Traceback' not in proc.stderr
    assert 'with_cls_token=False' in proc.stderr  # the backbone's warning names the setting
    state = torch.load(out, weights_only=False)
    weights = state.get('state_dict', state)
    assert 'cls_token' not in weights and 'pos_embed' not in weights
    teacher_state = torch.load(teacher, weights_only=True)
    assert torch.equal(weights['blocks.0.mlp.fc1.weight'], teacher_state['blocks.0.mlp.fc1.weight'])


def test_a_teacher_of_another_arch_is_an_error_line(teacher, tmp_path):
    """--arch / --family that do not describe the checkpoint: the key / shape report came as a
    CheckpointMismatchError traceback whose fix (strict=False) the command line cannot take."""
    wider = TINY.replace('"embed_dims": 32', '"embed_dims": 48')
    proc = _run([teacher, str(tmp_path / 's.pth'), '--arch', wider, '--operator', 'elu'])
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr
    assert proc.stderr.startswith('error: ') and "--arch" in proc.stderr
    assert not osp.exists(str(tmp_path / 's.pth'))
    proc = _run([str(tmp_path), str(tmp_path / 's.pth'), '--arch', TINY, '--operator', 'elu'])
    assert proc.returncode == 1 and 'is a directory' in proc.stderr, proc.stderr


def test_a_non_square_teacher_grid_is_kept(tmp_path):
    """The student is built at the teacher's (H, W) grid (recorded in its file), not (W, H)."""
    torch.manual_seed(0)
    teacher = VisionTransformer(dict(embed_dims=32, num_layers=2, num_heads=2,
                                     mlp_hidden_dims=64), family='deit', img_size=(32, 64))
    assert tuple(teacher.pos_grid) == (2, 4)
    source, out = str(tmp_path / 'teacher.pth'), str(tmp_path / 'student.pth')
    torch.save(teacher.state_dict(), source)
    proc = _run([source, out, '--arch', TINY, '--operator', 'elu'])
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = torch.load(out, map_location='cpu', weights_only=False)
    assert list(ckpt['meta']['student_cfg']['img_size']) == [32, 64]
    student = VisionTransformer(**ckpt['meta']['student_cfg'])
    student.load_state_dict(ckpt['state_dict'], strict=True)
    assert tuple(student.pos_grid) == (2, 4)
    torch.testing.assert_close(student.pos_embed, teacher.pos_embed)
