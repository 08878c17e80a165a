"""mmlinvit.datasets.synthetic_scenes: generated data in the real ADE20K / Cityscapes layouts,
read back by mmseg's own dataset classes."""
import numpy as np
from mmengine.registry import init_default_scope
from PIL import Image

from mmlinvit.datasets import SCENE_CLASSES, make_ade20k_layout, make_cityscapes_layout


def test_ade20k_layout_is_listed_by_mmseg_with_ade_labels(tmp_path):
    root = str(tmp_path / 'ADEChallengeData2016')
    stems = make_ade20k_layout(root, num_train=3, num_val=2, size=(24, 40), seed=1)
    assert [len(stems['training']), len(stems['validation'])] == [3, 2]
    init_default_scope('mmseg')
    from mmseg.datasets import ADE20KDataset
    ds = ADE20KDataset(data_root=root, data_prefix=dict(img_path='images/validation',
                                                        seg_map_path='annotations/validation'),
                       pipeline=[], lazy_init=False)
    assert len(ds) == 2
    info = ds.get_data_info(0)
    label = np.array(Image.open(info['seg_map_path']))
    assert Image.open(info['img_path']).size == (40, 24) and label.shape == (24, 40)
    assert label.min() >= 0 and label.max() <= len(SCENE_CLASSES)  # 0 = unlabelled, c + 1


def test_cityscapes_layout_uses_train_ids_and_is_reproducible(tmp_path):
    first = make_cityscapes_layout(str(tmp_path / 'a'), num_train=2, num_val=1, seed=3)
    make_cityscapes_layout(str(tmp_path / 'b'), num_train=2, num_val=1, seed=3)
    init_default_scope('mmseg')
    from mmseg.datasets import CityscapesDataset
    ds = CityscapesDataset(data_root=str(tmp_path / 'a'),
                           data_prefix=dict(img_path='leftImg8bit/train',
                                            seg_map_path='gtFine/train'),
                           pipeline=[], lazy_init=False)
    assert len(ds) == 2 and len(first['val']) == 1
    for name in ('img_path', 'seg_map_path'):
        a = np.array(Image.open(ds.get_data_info(0)[name]))
        b = np.array(Image.open(ds.get_data_info(0)[name].replace('/a/', '/b/')))
        assert np.array_equal(a, b)  # same seed, same files
    label = np.array(Image.open(ds.get_data_info(0)['seg_map_path']))
    assert set(np.unique(label)) <= set(range(19)) | {255}  # Cityscapes train ids
