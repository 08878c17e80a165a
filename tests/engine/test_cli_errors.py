"""User mistakes on the command line end in one ``error:`` line naming the problem and the fix
(exit status 1), not in a traceback from deep inside a library."""
import copy

import pytest
import torch

from train_testing import dump, load_tool, make_toy_scenes, toy_config, with_validation

pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


def test_a_checkpoint_of_another_operator_is_an_error_line(tmp_path, toy_root):
    """An ELU+1 checkpoint evaluated with a softmax config: the message was right but came as
    an AttentionOperatorMismatchError traceback."""
    from mmengine.registry import MODELS, init_default_scope
    cfg = toy_config(toy_root, str(tmp_path / 'wd'), max_iters=1)
    init_default_scope('mmseg')
    student = copy.deepcopy(cfg.model)
    student.backbone.update(type='mmlinvit.LinearVisionTransformer', attn_cfg='elu')
    ckpt = tmp_path / 'elu.pth'
    torch.save({'meta': {}, 'state_dict': MODELS.build(student).state_dict()}, ckpt)
    path = dump(cfg, str(tmp_path / 'softmax.py'))
    with pytest.raises(SystemExit, match=r"(?s)^error: .*attn_cfg='elu'") as info:
        load_tool('test').main([path, str(ckpt), '--work-dir', str(tmp_path / 'test')])
    assert 'Traceback' not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU-only refusal')
def test_a_gpu_launcher_on_a_cpu_machine_is_an_error_line(tmp_path, toy_root, monkeypatch):
    """(--amp on CPU: tests/engine/test_accumulation.py.)"""
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    path = dump(toy_config(toy_root, str(tmp_path / 'wd'), max_iters=1), str(tmp_path / 'c.py'))
    with pytest.raises(SystemExit, match='(?s)^error: .*torchrun and --launcher pytorch'):
        load_tool('train').main([path, '--work-dir', str(tmp_path / 'wd'), '--launcher', 'slurm'])


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_mmlinvit_bases_from_an_uninstalled_checkout_are_an_error_line(tmp_path, monkeypatch,
                                                                      tool):
    """A checkout only on PYTHONPATH (no mmlinvit/.mim) refused `mmlinvit::` bases with the
    right message at the end of a 15-line traceback."""
    import mmlinvit.config_scopes as config_scopes
    monkeypatch.setattr(config_scopes, 'get_installed_path', lambda name: str(tmp_path))
    child = tmp_path / 'child.py'
    child.write_text("_base_ = ['mmlinvit::demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py']\n")
    args = [str(child)] + ([str(tmp_path / 'x.pth')] if tool == 'test' else [])
    with pytest.raises(SystemExit, match=r'^error: mmlinvit:: configs are not installed.*'
                       r'pip install -e'):
        load_tool(tool).main(args)


def test_a_runner_checkpoint_as_pretrained_loads_and_an_untrusted_file_is_an_error_line(
        tmp_path, toy_root):
    """``pretrained=<runner checkpoint>`` stopped with two tracebacks whose first fix (an
    ``--trust-checkpoint`` flag) tools/train.py does not have: a runner checkpoint of this
    project now reads safely (its training state as inert stand-ins), and a file
    holding other objects is one ``error:`` line naming the one-time re-save."""
    import argparse

    cfg = with_validation(toy_config(toy_root, str(tmp_path / 'first'), max_iters=1,
                                     interval=1), toy_root, interval=1, save_best='mIoU')
    load_tool('train').main([dump(cfg, str(tmp_path / 'first.py'))])
    ckpt = tmp_path / 'first' / 'iter_1.pth'
    trained = torch.load(ckpt, map_location='cpu', weights_only=False)
    assert 'message_hub' in trained  # a genuine runner checkpoint
    # mmseg's IoUMetric gives save_best a numpy float32, pickled with its numpy dtype class
    assert type(trained['message_hub']['runtime_info']['best_score']).__module__ == 'numpy'

    from mmengine.registry import MODELS, init_default_scope
    init_default_scope('mmseg')
    backbone = copy.deepcopy(cfg.model.backbone)
    backbone.pretrained = str(ckpt)
    model = MODELS.build(backbone)
    model.init_weights()
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained['state_dict']['backbone.' + key]), key

    foreign = tmp_path / 'foreign.pth'
    torch.save(dict(state_dict=trained['state_dict'], args=argparse.Namespace(lr=0.1)), foreign)
    second = toy_config(toy_root, str(tmp_path / 'second'), max_iters=1)
    second.model.backbone.pretrained = str(foreign)
    with pytest.raises(SystemExit, match=r'(?s)^error: .*argparse\.Namespace.*'
                       r'convert_checkpoint\.py .*--trust-checkpoint') as info:
        load_tool('train').main([dump(second, str(tmp_path / 'second.py'))])
    assert 'Traceback' not in str(info.value)
    assert 'CLI: --trust-checkpoint' not in str(info.value)
