"""Pad-size preflight: a crop larger than the preprocessor size on one side only, and a
distillation model whose student carries the preprocessor."""
from mmengine.config import Config
from mmlinvit.engine.pad_size_check import find_pad_size_problem


def _cfg(crop, model):
    return Config(dict(model=model, train_dataloader=dict(dataset=dict(
        type='ADE20KDataset', data_root='data/none',
        pipeline=[dict(type='RandomCrop', crop_size=crop)]))))


def test_crop_wider_than_the_preprocessor_size_is_reported():
    cfg = _cfg((512, 1024), dict(data_preprocessor=dict(size=(512, 512))))
    problem = find_pad_size_problem(cfg)
    assert problem is not None and 'is smaller than the (512, 1024) training crop' in problem, \
        problem


def test_student_preprocessor_of_a_distillation_model_is_checked():
    cfg = _cfg((512, 256), dict(type='DistillationModel',
                                student=dict(data_preprocessor=dict(size=(512, 512)))))
    problem = find_pad_size_problem(cfg)
    assert problem is not None and 'model.student.data_preprocessor.size=(512, 512) pads ' \
        'every (512, 256)' in problem, problem
