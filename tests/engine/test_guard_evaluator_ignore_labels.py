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
    assert errors == []
    assert any('val_evaluator ignores label(s) [255] but the heads ignore [0, 255]' in w
               for w in warnings), warnings
