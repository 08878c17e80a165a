"""OpenMMLab integration of mmlinvit's models (imported lazily by ``mmlinvit.registry``).

:mod:`.register` puts the torch-only backbones, attention operators and distillation losses
into the ``mmlinvit`` MODELS registry; importing :mod:`.distill` and :mod:`.segmentors`
registers the classes defined there (``DistillationModel``, ``LinearConnector``,
``EncoderDecoder``); :mod:`.necks` registers ``FullGridFeature2Pyramid``.
"""
from . import distill, necks, segmentors  # noqa: F401
from .register import register_all

register_all()
