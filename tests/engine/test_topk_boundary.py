"""The top-k accuracy check of the config consistency checks, at its boundary.

Guards :func:`mmlinvit.engine.config_consistency._evaluation_problems`: mmpretrain's
``Accuracy`` runs ``torch.topk(pred, k)`` on (batch, num_classes) scores, which fails for
``k > num_classes`` at the first validation (training) or in ``tools/test.py``; ``k ==
num_classes`` is defined (top-k accuracy 100 %).  So a config is refused exactly when
``max(topk) > num_classes``.  The existing test uses top-5 with 2 classes, far from the boundary,
and an off-by-one (``> num_classes + 1``) passed every test (mutation-audit survivor m31): top-3
with 2 classes was accepted and then stopped the run.  Here ``num_classes = k - 1`` must be
refused and ``num_classes = k`` accepted, for the test-time check (``test_evaluator``) and the
training-time one (``val_evaluator``), on the shrunk Stage-3 classification recipe that
``tests/engine/train_testing.py`` provides, with an image folder of ``num_classes`` classes.
"""
import os
import os.path as osp

import pytest

from mmlinvit.engine.config_consistency import (ConfigConsistencyError,
                                                check_config_consistency,
                                                check_test_config_consistency)

from train_testing import toy_cls_config

pytestmark = pytest.mark.usefixtures('one_thread')


def _image_folder(root: str, num_classes: int, num_per_class: int = 2, size: int = 40) -> str:
    """Random PNGs in mmpretrain CustomDataset layout ``root/train/c<i>/*.png``."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in range(num_classes):
        folder = osp.join(root, 'train', f'c{c}')
        os.makedirs(folder, exist_ok=True)
        for idx in range(num_per_class):
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(osp.join(folder, f'{idx:03d}.png'))
    return root


def _cls_config(tmp_path, num_classes: int):
    """The toy classification recipe with ``num_classes`` classes in head, preprocessor and
    data, the training set reused for validation and test."""
    data = _image_folder(str(tmp_path / f'data{num_classes}'), num_classes)
    cfg = toy_cls_config(data, str(tmp_path / 'wd'))
    cfg.model.head.num_classes = num_classes
    cfg.model.data_preprocessor.num_classes = num_classes
    cfg.test_dataloader = cfg.train_dataloader
    cfg.val_dataloader = cfg.train_dataloader
    return cfg


# (k, num_classes): refused one below the boundary, accepted on it (and above it).
REFUSED = [(2, 1), (3, 2), (5, 4)]
ACCEPTED = [(2, 2), (3, 3), (5, 5), (3, 4)]


@pytest.mark.parametrize('k,num_classes', REFUSED)
def test_test_evaluator_topk_above_the_class_count_is_refused(tmp_path, k, num_classes):
    cfg = _cls_config(tmp_path, num_classes)
    cfg.test_evaluator = dict(type='Accuracy', topk=(1, k))
    with pytest.raises(ConfigConsistencyError,
                       match=rf'test_evaluator.topk=\(1, {k}\) but the model has '
                             rf'{num_classes} classes'):
        check_test_config_consistency(cfg)


@pytest.mark.parametrize('k,num_classes', ACCEPTED)
def test_test_evaluator_topk_up_to_the_class_count_is_accepted(tmp_path, k, num_classes):
    cfg = _cls_config(tmp_path, num_classes)
    cfg.test_evaluator = dict(type='Accuracy', topk=(1, k))
    check_test_config_consistency(cfg)


@pytest.mark.parametrize('k,num_classes', REFUSED[1:2] + ACCEPTED[1:2])
def test_val_evaluator_boundary_at_training_time(tmp_path, k, num_classes):
    """The training-time check (first validation) draws the same line; an int topk too."""
    cfg = _cls_config(tmp_path, num_classes)
    cfg.val_cfg = dict()
    cfg.val_evaluator = dict(type='Accuracy', topk=k)
    if k > num_classes:
        with pytest.raises(ConfigConsistencyError,
                           match=rf'val_evaluator.topk=\({k},\) but the model has '
                                 rf'{num_classes} classes'):
            check_config_consistency(cfg)
    else:
        check_config_consistency(cfg)
