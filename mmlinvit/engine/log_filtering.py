"""Records of the current MMLogger held back (or counted) while a block runs.

Some OpenMMLab steps log one line per item where one summary is what a user needs
(mmengine's optimizer constructor warns for every frozen parameter), or log a note that the
calling tool knows to be wrong in its context (a distillation teacher "keeps its random
initialisation" while ``export_onnx.py`` loads its weights right after).
"""
import contextlib
import logging
from typing import Callable, Iterator

from mmengine.logging import MMLogger


@contextlib.contextmanager
def current_logger_filter(keep: Callable[[logging.LogRecord], bool]) -> Iterator[None]:
    """Inside the block, the current MMLogger emits only the records ``keep`` accepts.

    Args:
        keep: Called with each record; False drops it (it may also count it).
    """
    logger = MMLogger.get_current_instance()
    record_filter = logging.Filter()
    record_filter.filter = keep
    logger.addFilter(record_filter)
    try:
        yield
    finally:
        logger.removeFilter(record_filter)
