"""OpenMMLab integration of mmlinvit's models (imported lazily by ``mmlinvit.registry``)."""
from .backbones import register_backbones
from .operators import register_attention_operators

register_backbones()
register_attention_operators()
from . import distill, losses  # noqa: F401,E402  (registers distillation models and losses)
from . import segmentors  # noqa: F401,E402  (registers mmlinvit.EncoderDecoder)
