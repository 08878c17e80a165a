"""The preflight's input checks at their edges: load_from in training runs, folders given as
checkpoints / ann_files, every member of a ConcatDataset, the whole problem list, the
batch-norm check on the student of a distillation config."""
import numpy as np
from PIL import Image

from mmlinvit.engine.preflight import find_batch_norm_problem, find_missing_inputs


def test_missing_load_from_is_named_in_train_mode(tmp_path):
    cfg = dict(model=dict(), load_from=str(tmp_path / 'missing_run.pth'))
    problems = find_missing_inputs(cfg, mode='train')
    assert len(problems) == 1 and 'load_from' in problems[0], problems
    # test mode loads the checkpoint argument, not load_from
    assert find_missing_inputs(cfg, mode='test') == []


def test_a_folder_given_as_checkpoint_is_missing(tmp_path):
    folder = tmp_path / 'ckpts'
    folder.mkdir()
    cfg = dict(model=dict(backbone=dict(pretrained=str(folder))))
    problems = find_missing_inputs(cfg, mode='train')
    assert len(problems) == 1 and 'model.backbone.pretrained' in problems[0], problems
    problems = find_missing_inputs(dict(model=dict()), mode='test', checkpoint=str(folder))
    assert len(problems) == 1 and 'checkpoint argument' in problems[0], problems


def test_a_file_given_as_data_prefix_folder_is_missing(tmp_path):
    (tmp_path / 'images').write_text('not a folder')
    cfg = dict(default_scope='mmpretrain', train_dataloader=dict(dataset=dict(
        type='CustomDataset', data_root=str(tmp_path), data_prefix=dict(img_path='images'))))
    problems = find_missing_inputs(cfg, mode='train')
    assert any('img_path folder' in p and 'does not exist' in p for p in problems), problems


def test_a_folder_given_as_ann_file_is_missing(tmp_path):
    (tmp_path / 'images' / 'cat').mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / 'images' / 'cat' / 'a.jpg')
    (tmp_path / 'train.txt').mkdir()
    cfg = dict(default_scope='mmpretrain', train_dataloader=dict(dataset=dict(
        type='CustomDataset', data_root=str(tmp_path), data_prefix=dict(img_path='images'),
        ann_file='train.txt')))
    problems = find_missing_inputs(cfg, mode='train')
    assert len(problems) == 1, problems
    assert 'annotation file' in problems[0] and 'train.txt' in problems[0], problems


def test_every_dataset_of_a_concat_dataset_is_checked(tmp_path):
    cfg = dict(train_dataloader=dict(dataset=dict(type='ConcatDataset', datasets=[
        dict(type='CustomDataset', data_root=str(tmp_path / 'first')),
        dict(type='CustomDataset', data_root=str(tmp_path / 'second'))])))
    problems = find_missing_inputs(cfg, mode='train')
    assert len(problems) == 2, problems
    assert 'datasets[1]' in problems[1] and 'second' in problems[1], problems


def test_syncbn_heads_with_batch_size_one_outside_a_distributed_run_are_refused():
    cfg = dict(launcher='none', train_dataloader=dict(batch_size=1),
               model=dict(decode_head=dict(type='UPerHead',
                                           norm_cfg=dict(type='SyncBN', requires_grad=True))))
    problem = find_batch_norm_problem(cfg)
    assert problem is not None and 'SyncBN' in problem
    assert find_batch_norm_problem(dict(cfg, launcher='pytorch')) is None


def test_pairing_of_a_later_dataset_is_checked_after_an_earlier_problem(tmp_path):
    """The train root is missing and the val image folder is empty: both are listed."""
    (tmp_path / 'val' / 'images').mkdir(parents=True)
    cfg = dict(default_scope='mmpretrain', val_cfg=dict(),
               train_dataloader=dict(dataset=dict(type='CustomDataset',
                                                  data_root=str(tmp_path / 'missing'))),
               val_dataloader=dict(dataset=dict(type='CustomDataset',
                                                data_root=str(tmp_path / 'val'),
                                                data_prefix=dict(img_path='images'))))
    problems = find_missing_inputs(cfg, mode='train')
    assert len(problems) == 2, problems
    assert 'val_dataloader.dataset' in problems[1], problems


def test_bn_heads_of_a_distillation_student_are_checked_and_the_teachers_are_not():
    bn = dict(type='BN', requires_grad=True)
    cfg = dict(launcher='none', train_dataloader=dict(batch_size=1), model=dict(
        type='mmlinvit.DistillationModel',
        student=dict(type='EncoderDecoder', decode_head=dict(type='UPerHead', norm_cfg=bn)),
        teacher=dict(type='VisionTransformer')))
    problem = find_batch_norm_problem(cfg)
    assert problem is not None and 'model.student.decode_head.norm_cfg=BN' in problem, problem
    # a frozen teacher runs in eval mode: its BatchNorm heads do not count
    cfg['model']['student']['decode_head']['norm_cfg'] = dict(type='GN', num_groups=4)
    cfg['model']['teacher'] = dict(type='EncoderDecoder',
                                   decode_head=dict(type='UPerHead', norm_cfg=bn))
    assert find_batch_norm_problem(cfg) is None
