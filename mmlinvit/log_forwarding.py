"""Records of the ``mmlinvit`` loggers go to the run's MMLogger (console and log file).

The torch-only layers log on ``logging.getLogger('mmlinvit')`` (and its children, e.g.
``mmlinvit.converters.loading``): what a checkpoint load initialised, which kernel backend
was chosen.  Python logging sends those records to the root logger, which mmengine does not
configure, so a WARNING reached stderr but never the ``<work_dir>/<timestamp>/<timestamp>.log``
file a user reads after the run.  :func:`install` (called when :mod:`mmlinvit.registry` is
imported, i.e. whenever mmlinvit runs inside OpenMMLab) also writes them to the log file(s)
of the current :class:`mmengine.logging.MMLogger`; they still propagate as before (console
once, ``pytest``'s ``caplog`` and any handler a user put on the root logger keep working).
"""
import logging

from mmengine.logging import MMLogger

#: The logger every mmlinvit module logs under.
LOGGER_NAME = 'mmlinvit'


class MMLoggerForwarder(logging.Handler):
    """Writes each record to the file handlers of the current MMLogger (if one exists)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not MMLogger._instance_dict:  # no Runner / tool logger yet: nothing to add
            return
        for handler in MMLogger.get_current_instance().handlers:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)


def install() -> None:
    """Attaches one :class:`MMLoggerForwarder` to the ``mmlinvit`` logger (idempotent)."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, MMLoggerForwarder) for h in logger.handlers):
        logger.addHandler(MMLoggerForwarder())
