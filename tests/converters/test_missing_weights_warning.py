"""A non-strict load that leaves weights at their init says so at WARNING level;
at DEBUG it was invisible at the default verbosity."""
import logging

from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters.loading import load_pretrained


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_weights_left_at_init_are_warned():
    model = VisionTransformer(arch=dict(embed_dims=48, num_layers=1, num_heads=3,
                                        mlp_hidden_dims=96), family='deit', img_size=32)
    sd = {k: v.clone() for k, v in model.state_dict().items() if k != 'blocks.0.mlp.fc1.bias'}
    logger = logging.getLogger('mmlinvit.converters.loading')
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        load_pretrained(model, sd, strict=False)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    found = [r for r in handler.records if 'not in the checkpoint and keep their init' in
             r.getMessage()]
    assert found and all(r.levelno == logging.WARNING for r in found), \
        [(r.levelname, r.getMessage()[:80]) for r in handler.records]
    assert 'blocks.0.mlp.fc1.bias' in found[0].getMessage()
