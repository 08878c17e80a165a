"""Issue 11 items 3-5: ``--resume`` with nothing to resume fails naming the work dir and what
was looked for; a damaged last checkpoint falls back to the newest intact one (warning with
both names); damaged checkpoint files (truncated, random bytes, empty) are reported with their
path and the cause - for resuming, ``load_from``, ``tools/test.py`` and model weights
(``pretrained=`` / ``mmlinvit.converters.load_checkpoint_file``), never advising to unpickle.
"""
import os
import os.path as osp

import pytest
import torch

from checkpoint_damage import flip_tensor_byte
from train_testing import (RunStopped, dump, load_tool, make_toy_scenes, read_losses,
                           toy_config)


pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory) -> str:
    return make_toy_scenes(str(tmp_path_factory.mktemp('toy') / 'toy_ade'))


def test_resume_with_nothing_to_resume_fails_with_the_path(tmp_path, toy_root):
    work_dir = tmp_path / 'mistyped'
    path = dump(toy_config(toy_root, str(work_dir), max_iters=2), str(tmp_path / 'cfg.py'))
    train = load_tool('train')
    with pytest.raises(SystemExit) as info:
        train.main([path, '--work-dir', str(work_dir), '--resume'])
    message = str(info.value)
    assert f'the work dir {work_dir} does not exist' in message
    assert osp.join(str(work_dir), 'last_checkpoint') in message
    assert osp.join(str(work_dir), 'iter_*.pth') in message
    assert not work_dir.exists()  # nothing was trained

    work_dir.mkdir()
    (work_dir / 'notes.txt').write_text('x')
    with pytest.raises(SystemExit, match=r'no checkpoint found .*notes\.txt'):
        train.main([path, '--work-dir', str(work_dir), '--resume'])
    assert sorted(os.listdir(work_dir)) == ['notes.txt']


def test_truncated_last_checkpoint_falls_back_to_the_previous_one(tmp_path, toy_root, capfd):
    work_dir = str(tmp_path / 'wd')
    cfg = toy_config(toy_root, work_dir, max_iters=10, interval=4)
    record = str(tmp_path / 'losses.jsonl')
    recorder = dict(type='RecordLossesHook', path=record)
    train = load_tool('train')
    path = dump(cfg, str(tmp_path / 'first.py'),
                hooks=[recorder, dict(type='StopHook', after_iter=8)])
    with pytest.raises(RunStopped):
        train.main([path, '--work-dir', work_dir])
    first = read_losses(record)[0]
    latest = osp.join(work_dir, 'iter_8.pth')
    size = osp.getsize(latest)
    with open(latest, 'r+b') as f:  # the job was killed while writing iter_8.pth
        f.truncate(size // 2)
    os.remove(record)

    path = dump(cfg, str(tmp_path / 'resume.py'), hooks=[recorder])
    capfd.readouterr()
    train.main([path, '--work-dir', work_dir, '--resume'])
    output = ''.join(capfd.readouterr())
    previous = osp.join(work_dir, 'iter_4.pth')
    assert f'{latest} is truncated' in output and f'Resuming from {previous}' in output
    resumed = read_losses(record)[0]
    assert sorted(resumed) == [5, 6, 7, 8, 9, 10]  # trained again from iteration 4
    for it in (5, 6, 7, 8):  # and exactly as before (issue 11 item 2)
        assert resumed[it]['loss'] == first[it]['loss'], it
    assert torch.load(osp.join(work_dir, 'iter_8.pth'), weights_only=False)['meta']['iter'] == 8


def _damage(path: str, how: str) -> None:
    if how == 'flipped':
        flip_tensor_byte(path)
        return
    data = open(path, 'rb').read()
    with open(path, 'wb') as f:
        if how == 'truncated':
            f.write(data[:len(data) * 2 // 3])
        elif how == 'random':
            f.write(os.urandom(len(data)))
        # 'empty': nothing


CAUSES = {
    'truncated': 'is truncated',
    'random': 'is not a PyTorch checkpoint',
    'empty': 'is empty (0 bytes)',
    'flipped': 'is damaged: its record',  # ... fails its CRC-32 check
}


@pytest.mark.parametrize('how', sorted(CAUSES))
def test_damaged_checkpoints_name_the_file_and_the_cause(tmp_path, toy_root, how):
    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.converters import load_checkpoint_file
    weights = str(tmp_path / 'weights.pth')
    torch.save(VisionTransformer(arch=dict(embed_dims=16, num_layers=1, num_heads=2,
                                           mlp_hidden_dims=32), img_size=32,
                                 patch_size=8).state_dict(), weights)
    _damage(weights, how)
    expected = f"'{weights}' {CAUSES[how]}"

    def check(message: str) -> None:
        assert expected in message, message
        assert 'trust' not in message.lower(), message

    # model weights (pretrained=, tools/linearize.py, converters)
    with pytest.raises(ValueError) as info:
        load_checkpoint_file(weights)
    check(str(info.value))

    work_dir = str(tmp_path / 'wd')
    cfg_path = dump(toy_config(toy_root, work_dir, max_iters=2), str(tmp_path / 'cfg.py'))
    train = load_tool('train')
    for flags in (['--resume', weights], ['--cfg-options', f'load_from={weights}']):
        with pytest.raises(SystemExit) as info:
            train.main([cfg_path, '--work-dir', work_dir, *flags])
        check(str(info.value))
    with pytest.raises(SystemExit) as info:
        load_tool('test').main([cfg_path, weights, '--work-dir', work_dir])
    check(str(info.value))
    assert not osp.exists(work_dir)  # nothing was built


def test_a_changed_tensor_byte_is_found_though_torch_load_reads_it(tmp_path):
    """``torch.load`` does not check the CRC-32 ``torch.save`` stores for each record: one
    flipped byte in a tensor record loaded as a changed weight, no word.  Every mmlinvit
    reader checks the records first; ``verify_data=False`` keeps to the directory and the
    pickle record, as before."""
    import zipfile

    from mmlinvit.converters.checkpoint_file import checkpoint_file_problem
    path = str(tmp_path / 'w.pth')
    weight = torch.arange(4096, dtype=torch.float32)
    torch.save({'w': weight}, path)
    assert checkpoint_file_problem(path) is None
    record = flip_tensor_byte(path)
    assert not torch.equal(torch.load(path, weights_only=True)['w'], weight)  # torch: silent
    assert zipfile.ZipFile(path).testzip() == record  # the zip module's own check agrees
    problem = checkpoint_file_problem(path)
    assert problem is not None and f'record {record!r} fails its CRC-32 check' in problem
    assert checkpoint_file_problem(path, verify_data=False) is None
    # a pathlib.Path (torch.save / torch.load take one) is read the same
    assert checkpoint_file_problem(tmp_path / 'w.pth') == problem
    assert checkpoint_file_problem(tmp_path / 'none.pth') == 'does not exist'


def test_a_changed_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    """``--resume``: a latest checkpoint whose tensor bytes changed is skipped (named, with the
    cause) for the newest intact one, as a truncated one."""
    from mmlinvit.engine.resume import select_resume_checkpoint
    from train_testing import captured_log
    work_dir = tmp_path / 'wd'
    work_dir.mkdir()
    for it in (4, 8):
        torch.save({'state_dict': {'w': torch.full((256, ), float(it))}, 'meta': {'iter': it}},
                   str(work_dir / f'iter_{it}.pth'))
    latest = str(work_dir / 'iter_8.pth')
    (work_dir / 'last_checkpoint').write_text(latest)
    flip_tensor_byte(latest)
    with captured_log() as lines:
        chosen = select_resume_checkpoint(str(work_dir))
    assert chosen == str(work_dir / 'iter_4.pth')
    assert any(f'{latest} is damaged' in m and 'CRC-32' in m for m in lines), lines


def test_a_changed_teacher_checkpoint_is_refused_naming_the_cause(tmp_path):
    """``teacher_ckpt`` of a task-model teacher (read by mmengine's ``load_checkpoint``,
    which never checks the records either)."""
    from mmengine.registry import init_default_scope

    from mmlinvit.models.distill.errors import DistillationConfigError
    from mmlinvit.models.distill.teacher import build_frozen_teacher
    init_default_scope('mmpretrain')
    cfg = dict(type='mmpretrain.ImageClassifier',
               backbone=dict(type='mmlinvit.VisionTransformer',
                             arch=dict(embed_dims=16, num_layers=1, num_heads=2,
                                       mlp_hidden_dims=32), img_size=32, patch_size=8),
               neck=dict(type='mmpretrain.GlobalAveragePooling'),
               head=dict(type='mmpretrain.LinearClsHead', num_classes=3, in_channels=16))
    from mmpretrain.registry import MODELS
    path = str(tmp_path / 'teacher.pth')
    torch.save({'state_dict': MODELS.build(cfg).state_dict()}, path)
    build_frozen_teacher(cfg, ckpt=path)  # intact: loads
    flip_tensor_byte(path)
    with pytest.raises(DistillationConfigError, match=r'is damaged: its record .* fails its '
                                                      r'CRC-32 check'):
        build_frozen_teacher(cfg, ckpt=path)


def test_resume_takes_the_unnumbered_checkpoint_last_checkpoint_names(tmp_path):
    """A fixed ``filename_tmpl`` (latest.pth): the file ``last_checkpoint`` names is resumed,
    not an older iter_*.pth."""
    import time

    from mmlinvit.engine.resume import select_resume_checkpoint

    def save(path, iteration):
        torch.save(dict(meta=dict(iter=iteration, epoch=0), state_dict={'w': torch.zeros(1)},
                        message_hub={}, optimizer={}), path)

    older = tmp_path / 'iter_2.pth'
    save(older, 2)
    past = time.time() - 100
    os.utime(older, (past, past))
    latest = tmp_path / 'latest.pth'
    save(latest, 8)
    (tmp_path / 'last_checkpoint').write_text(str(latest))
    assert osp.normpath(select_resume_checkpoint(str(tmp_path))) == osp.normpath(str(latest))
