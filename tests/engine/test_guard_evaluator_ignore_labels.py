"""The evaluator / heads ignore_index warning also fires when the heads ignore a label the
metric scores (only labels the metric ignores beyond the heads were warned)."""
from mmengine.config import Config
from mmlinvit.engine.config_consistency import _ignore_index_problems


def test_heads_ignoring_a_label_the_metric_scores_is_warned():
    cfg = Config(dict(
        model=dict(type='EncoderDecoder',
                   data_preprocessor=dict(type='SegDataPreProcessor', seg_pad_val=255),
                   decode_head=dict(type='UPerHead', num_classes=19, ignore_index=255),
                   auxiliary_head=dict(type='FCNHead', num_classes=19, ignore_index=0)),
        val_cfg=dict(type='ValLoop'),
        val_dataloader=dict(dataset=dict(type='ADE20KDataset')),
        val_evaluator=dict(type='IoUMetric', ignore_index=255)))
    errors, warnings = _ignore_index_problems(cfg, 'train')
    assert len(errors) == 1 and 'model.auxiliary_head.ignore_index=0' in errors[0], errors
    assert any('val_evaluator ignores label(s) [255] but the heads ignore [0, 255]' in w
               for w in warnings), warnings


def test_a_head_that_does_not_ignore_the_padding_is_refused():
    """Both heads learn from the same padded label maps: a head whose ignore_index is not
    ``seg_pad_val`` gets the padding (255) as a target.  The oracle: mmseg's own FCNHead loss
    on a 255-padded label map, which stops with an out-of-range target (before, the check
    passed because *some* head ignored 255)."""
    import pytest
    import torch
    from mmseg.models.decode_heads import FCNHead
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData

    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmseg'):  # its loss is mmseg's CrossEntropyLoss
        head = FCNHead(in_channels=4, channels=4, num_convs=1, num_classes=3, ignore_index=0)
    label = torch.ones(1, 8, 8, dtype=torch.long)
    label[:, 6:] = 255  # seg_pad_val padding
    sample = SegDataSample(gt_sem_seg=PixelData(data=label))
    with pytest.raises((IndexError, RuntimeError)):
        head.loss([torch.randn(1, 4, 8, 8)], [sample], dict())
    label[:, 6:] = 2  # an in-range label there: the same call runs
    assert torch.isfinite(head.loss([torch.randn(1, 4, 8, 8)], [sample], dict())['loss_ce'])
    cfg = Config(dict(model=dict(
        type='EncoderDecoder',
        data_preprocessor=dict(type='SegDataPreProcessor', seg_pad_val=255),
        decode_head=dict(type='UPerHead', num_classes=3, ignore_index=255),
        auxiliary_head=dict(type='FCNHead', num_classes=3, ignore_index=0))))
    errors, _ = _ignore_index_problems(cfg, 'train')
    assert len(errors) == 1, errors
    assert 'seg_pad_val=255 is not a label every head ignores' in errors[0]
    assert 'model.auxiliary_head.ignore_index=0' in errors[0]
    assert 'decode_head' not in errors[0]
    cfg.model.auxiliary_head.ignore_index = 255
    assert _ignore_index_problems(cfg, 'train')[0] == []
