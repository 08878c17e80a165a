"""A slide stride larger than the crop on one side only is an error."""
from mmengine.config import Config
from mmlinvit.engine.config_consistency import _evaluation_problems


def test_stride_larger_in_width_only_is_reported():
    cfg = Config(dict(model=dict(type='EncoderDecoder', test_cfg=dict(
        mode='slide', crop_size=(32, 32), stride=(21, 48)))))
    problems = _evaluation_problems(cfg, 'test')
    assert any('stride=(21, 48) is larger than its crop_size=(32, 32)' in p
               for p in problems), problems
