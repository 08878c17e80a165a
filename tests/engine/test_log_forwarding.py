"""WARNINGs of the mmlinvit loggers, and the checkpoint load report, reach the run's log file
(mmlinvit.log_forwarding)."""
import logging

from mmengine.logging import MMLogger

import mmlinvit.registry  # noqa: F401  (installs the forwarding)
from mmlinvit.log_forwarding import MMLoggerForwarder


def test_mmlinvit_warnings_reach_the_mmlogger_log_file_once(tmp_path, caplog):
    log_file = tmp_path / 'run.log'
    MMLogger.get_instance('log_forwarding_test', log_file=str(log_file), log_level='INFO')
    logging.getLogger('mmlinvit.converters.loading').warning('initialised keys: %s', 'mask_token')
    logging.getLogger('mmlinvit').info('below the warning level: not shown')
    for handler in MMLogger.get_current_instance().handlers:
        handler.flush()
    text = log_file.read_text()
    assert 'initialised keys: mask_token' in text and 'below the warning level' not in text
    assert text.count('initialised keys: mask_token') == 1
    # still propagated as before (console / caplog / root handlers), and installed once
    assert [r.getMessage() for r in caplog.records] == ['initialised keys: mask_token']
    handlers = [h for h in logging.getLogger('mmlinvit').handlers
                if isinstance(h, MMLoggerForwarder)]
    assert len(handlers) == 1 and logging.getLogger('mmlinvit').propagate


def test_the_load_report_reaches_the_log_file(tmp_path):
    """Which file ``pretrained=`` loaded (and what was resampled) was logged at INFO on a logger
    at the root's WARNING level: no run log said it."""
    import torch

    from mmlinvit.backbones import VisionTransformer
    log_file = tmp_path / 'load.log'
    MMLogger.get_instance('load_report_test', log_file=str(log_file), log_level='INFO')
    arch = dict(embed_dims=16, num_layers=1, num_heads=2, mlp_hidden_dims=32)
    source = VisionTransformer(arch=arch, img_size=32, patch_size=8)
    path = tmp_path / 'backbone.pth'
    torch.save(source.state_dict(), path)
    target = VisionTransformer(arch=arch, img_size=48, patch_size=8, pretrained=str(path))
    target.init_weights()
    for handler in MMLogger.get_current_instance().handlers:
        handler.flush()
    text = log_file.read_text()
    assert f"Loaded '{path}'" in text and 'VisionTransformer' in text and 'grid (6, 6)' in text


def test_warnings_still_reach_stderr_without_root_handlers():
    """The forwarder is a handler of the mmlinvit logger, so Python's last-resort stderr
    handler never ran: "N tensor(s) ... are not in the checkpoint" reached no console."""
    import subprocess
    import sys
    script = ('import logging, mmlinvit.registry\n'
              'from mmengine.logging import MMLogger\n'
              "MMLogger.get_instance('x', log_level='INFO')\n"
              "logging.getLogger('mmlinvit.converters.loading').warning('12 tensors missing')\n")
    proc = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stderr + proc.stdout).count('12 tensors missing') == 1, proc.stderr
