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
from typing import Optional

from mmengine.logging import MMLogger

#: The logger every mmlinvit module logs under.
LOGGER_NAME = 'mmlinvit'


def _other_handlers(name: str) -> bool:
    """Whether a record of logger ``name`` meets a handler other than the forwarder on its way
    up (Python's own test for its last-resort handler, which stops where ``propagate`` is off).
    """
    logger: Optional[logging.Logger] = logging.getLogger(name)
    while logger is not None:
        if any(not isinstance(h, MMLoggerForwarder) for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


class MMLoggerForwarder(logging.Handler):
    """Writes each record to the file handlers of the current MMLogger (if one exists)."""

    def emit(self, record: logging.LogRecord) -> None:
        # Being a handler, this one stops Python from printing WARNINGs on stderr by itself
        # (its last-resort handler runs only when no logger on the way has a handler): do it
        # here when the record meets no other handler on its way up, as before the forwarding.
        if not _other_handlers(record.name) and logging.lastResort is not None and \
                record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)
        if not MMLogger._instance_dict:  # no Runner / tool logger yet: nothing to add
            return
        for handler in MMLogger.get_current_instance().handlers:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)


#: Loggers whose INFO records are run-log material too: the checkpoint load report (which
#: file was loaded into which model, what was resampled, dropped or initialised).
INFO_LOGGERS = ('mmlinvit.converters.loading', )


def install() -> None:
    """Attaches one :class:`MMLoggerForwarder` to the ``mmlinvit`` logger (idempotent).

    The loggers of :data:`INFO_LOGGERS` are set to INFO (when no level was set on them), so
    their INFO records reach the log file; Python prints records below WARNING on the console
    only when an application configured a handler for them.
    """
    for name in INFO_LOGGERS:
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.INFO)
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, MMLoggerForwarder) for h in logger.handlers):
        logger.addHandler(MMLoggerForwarder())
