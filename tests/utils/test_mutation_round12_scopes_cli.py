"""Mutation round 12: config scopes, the scope import hook, log forwarding, cli, NameRegistry.

The ``mmlinvit::`` tests point the ``mmlinvit`` scope at a throw-away package written under
``tmp_path`` (its own ``.mim/configs`` and ``model-index.yml``), so that they run in-process
against the tree under test and know exactly which file each base must come from.
"""
import argparse
import importlib
import logging
import os.path as osp
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from mmengine.config import Config
from mmengine.config import utils as config_utils

import mmlinvit.registry  # noqa: F401  (registers the scopes and the log forwarding)
from mmlinvit import _config_scope_hook, config_scopes, log_forwarding
from mmlinvit.utils.cli import add_trust_checkpoint_argument, checkpoint_io_parser, load_script
from mmlinvit.utils.name_registry import NameRegistry

#: Name of the throw-away package that plays the installed mmlinvit.
FAKE_PACKAGE = 'mmlinvit_round12_fake_pkg'


def _write(path: Path, text: str) -> Path:
    """Writes ``text`` to ``path`` (parents created) and returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def fake_mmlinvit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package with ``.mim/configs`` that the ``mmlinvit`` scope resolves to.

    Returns:
        The package directory.
    """
    package = tmp_path / 'site' / FAKE_PACKAGE
    _write(package / '__init__.py', '')
    _write(package / '.mim' / 'model-index.yml', 'Import: []\n')
    configs = package / '.mim' / 'configs'
    _write(configs / '_base_' / 'seg_scoped.py',
           "default_scope = 'mmseg'\nmodel = dict(type='EncoderDecoder', marker='fake-seg')\n")
    _write(configs / '_base_' / 'cls_scoped.py',
           "default_scope = 'mmpretrain'\nmodel = dict(type='ImageClassifier')\n")
    _write(configs / '_base_' / 'unscoped.py', "model = dict(type='Plain', marker='unscoped')\n")
    # same relative path as a file shipped by mmseg: the mmlinvit:: base must be this one
    _write(configs / '_base_' / 'models' / 'upernet_vit-b16_ln_mln.py',
           "default_scope = 'mmseg'\nmodel = dict(type='FromMmlinvit')\n")
    monkeypatch.syspath_prepend(str(tmp_path / 'site'))
    importlib.invalidate_caches()
    monkeypatch.setitem(config_utils.MODULE2PACKAGE, 'mmlinvit', FAKE_PACKAGE)
    return package


def _user_config(tmp_path: Path, base: str) -> Config:
    """Loads a user config whose only content is ``_base_ = [base]``."""
    path = _write(tmp_path / 'user' / 'user_cfg.py', f'_base_ = [{base!r}]\n')
    return Config.fromfile(str(path))


# ------------------------------------------------------------------ config_scopes
def test_installed_distribution_skips_missing_names_and_keeps_order():
    assert config_scopes.installed_distribution(
        ('round12-not-a-distribution', 'onedl-mmpretrain', 'onedl-mmsegmentation')
    ) == 'onedl-mmpretrain'
    assert config_scopes.installed_distribution(('round12-not-a-distribution', )) is None
    assert config_scopes.installed_distribution(()) is None


def test_onedl_fork_wins_when_both_names_are_installed(monkeypatch: pytest.MonkeyPatch):
    """With the fork and the upstream name both installed, the fork (the pinned stack) wins."""
    monkeypatch.setattr(config_scopes, 'distribution', lambda name: object())
    saved = dict(config_utils.MODULE2PACKAGE)
    try:
        registered = config_scopes.register_config_scopes()
    finally:
        config_utils.MODULE2PACKAGE.clear()
        config_utils.MODULE2PACKAGE.update(saved)
    assert registered == {'mmseg': 'onedl-mmsegmentation', 'mmpretrain': 'onedl-mmpretrain',
                          'mmdet': 'onedl-mmdetection', 'mmlinvit': 'mmlinvit'}


def test_scope_without_installed_candidate_is_left_to_mmengine(monkeypatch: pytest.MonkeyPatch):
    """No mmdet distribution installed: MODULE2PACKAGE['mmdet'] keeps mmengine's upstream
    name (its error then says "mmdet is not installed"), and 'mmdet' is not reported."""
    from importlib.metadata import PackageNotFoundError, distribution

    def only_seg_and_pretrain(name: str):
        if 'mmdet' in name:
            raise PackageNotFoundError(name)
        return distribution(name)

    monkeypatch.setattr(config_scopes, 'distribution', only_seg_and_pretrain)
    monkeypatch.setitem(config_utils.MODULE2PACKAGE, 'mmdet', 'mmdet')
    saved = dict(config_utils.MODULE2PACKAGE)
    try:
        registered = config_scopes.register_config_scopes()
        mmdet_package = config_utils.MODULE2PACKAGE['mmdet']
        mmlinvit_package = config_utils.MODULE2PACKAGE['mmlinvit']
    finally:
        config_utils.MODULE2PACKAGE.clear()
        config_utils.MODULE2PACKAGE.update(saved)
    assert 'mmdet' not in registered and mmdet_package == 'mmdet'
    assert registered['mmseg'] == 'onedl-mmsegmentation' and mmlinvit_package == 'mmlinvit'


def test_get_cfg_path_is_wrapped_exactly_once():
    for _ in range(3):
        config_scopes.register_config_scopes()
    wrapper = Config.__dict__['_get_cfg_path']
    wrapper = wrapper.__func__ if isinstance(wrapper, staticmethod) else wrapper
    original = getattr(wrapper, config_scopes._WRAPPED_MARK)
    assert not hasattr(original, config_scopes._WRAPPED_MARK)  # no wrapper of a wrapper


def test_mmlinvit_config_root_is_the_configs_folder(fake_mmlinvit: Path):
    assert osp.realpath(config_scopes.mmlinvit_config_root()) == osp.realpath(
        fake_mmlinvit / '.mim' / 'configs')


@pytest.mark.parametrize('removed', ['model-index.yml', 'configs'])
def test_missing_mim_part_names_the_fix(fake_mmlinvit: Path, tmp_path: Path, removed: str):
    """Either half of .mim missing: ConfigsNotInstalledError naming it and the pip command,
    also when reached through a ``mmlinvit::`` base (not mmengine's own bare error)."""
    import shutil
    target = fake_mmlinvit / '.mim' / removed
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(config_scopes.ConfigsNotInstalledError,
                       match=r'pip install -e <mmlinvit repo>') as info:
        config_scopes.mmlinvit_config_root()
    assert removed in str(info.value)
    with pytest.raises(config_scopes.ConfigsNotInstalledError, match='not installed'):
        _user_config(tmp_path, 'mmlinvit::_base_/unscoped.py')


def test_mmlinvit_base_gets_its_declared_default_scope(fake_mmlinvit: Path, tmp_path: Path):
    seg = _user_config(tmp_path, 'mmlinvit::_base_/seg_scoped.py')
    assert seg.model._scope_ == 'mmseg' and seg.model.marker == 'fake-seg'
    cls = _user_config(tmp_path, 'mmlinvit::_base_/cls_scoped.py')
    assert cls.model._scope_ == 'mmpretrain'
    path, scope = Config._get_cfg_path('mmlinvit::_base_/cls_scoped.py', 'x.py')
    assert scope == 'mmpretrain'
    assert osp.realpath(path) == osp.realpath(
        fake_mmlinvit / '.mim' / 'configs' / '_base_' / 'cls_scoped.py')


def test_mmlinvit_base_without_default_scope_stays_untagged(fake_mmlinvit: Path,
                                                             tmp_path: Path):
    cfg = _user_config(tmp_path, 'mmlinvit::_base_/unscoped.py')
    assert cfg.model.marker == 'unscoped' and '_scope_' not in cfg.model
    assert Config._get_cfg_path('mmlinvit::_base_/unscoped.py', 'x.py')[1] is None


def test_same_named_file_comes_from_the_scope_named(fake_mmlinvit: Path, tmp_path: Path):
    """mmseg ships ``_base_/models/upernet_vit-b16_ln_mln.py`` too: each scope reads its own."""
    ours = _user_config(tmp_path, 'mmlinvit::_base_/models/upernet_vit-b16_ln_mln.py')
    assert ours.model.type == 'FromMmlinvit'
    theirs = _user_config(tmp_path, 'mmseg::_base_/models/upernet_vit-b16_ln_mln.py')
    assert theirs.model.type == 'EncoderDecoder' and theirs.model._scope_ == 'mmseg'
    assert theirs.model.backbone.type == 'VisionTransformer'


def test_local_base_is_read_next_to_the_config(tmp_path: Path):
    """A plain relative base is not touched by the wrapper (scope None, local file)."""
    _write(tmp_path / 'user' / 'mmlinvit.py', "model = dict(type='Local')\n")
    path, scope = Config._get_cfg_path('mmlinvit.py', str(tmp_path / 'user' / 'u.py'))
    assert (path, scope) == (str(tmp_path / 'user' / 'mmlinvit.py'), None)


# ------------------------------------------------------------------ _config_scope_hook
def test_hook_install_adds_one_finder(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delitem(sys.modules, _config_scope_hook._TRIGGER)
    monkeypatch.setattr(sys, 'meta_path', [f for f in sys.meta_path
                                           if not isinstance(f, _config_scope_hook.ConfigScopeFinder)])
    _config_scope_hook.install()
    _config_scope_hook.install()
    finders = [f for f in sys.meta_path if isinstance(f, _config_scope_hook.ConfigScopeFinder)]
    assert len(finders) == 1 and sys.meta_path[0] is finders[0]


def test_hook_install_registers_at_once_when_trigger_is_loaded(monkeypatch: pytest.MonkeyPatch):
    calls: List[str] = []
    monkeypatch.setattr(_config_scope_hook, '_register', lambda: calls.append('now'))
    monkeypatch.setattr(sys, 'meta_path', list(sys.meta_path))
    _config_scope_hook.install()
    assert calls == ['now']


def test_finder_registers_after_the_trigger_module_ran(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    """Only the trigger module gets the wrapped loader; registration runs after its code."""
    trigger = 'round12_trigger_mod'
    _write(tmp_path / f'{trigger}.py', 'import round12_log\nround12_log.append("exec")\n')
    _write(tmp_path / 'round12_other.py', 'X = 1\n')
    log: List[str] = []
    fake_log = type(sys)('round12_log')
    fake_log.append = log.append
    monkeypatch.setitem(sys.modules, 'round12_log', fake_log)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_config_scope_hook, '_TRIGGER', trigger)
    monkeypatch.setattr(_config_scope_hook, '_register', lambda: log.append('register'))
    finder = _config_scope_hook.ConfigScopeFinder()
    # the installed hook's own finder (on sys.meta_path until mmengine is imported) is left out:
    # it would wrap the trigger too
    others = [f for f in sys.meta_path
              if not isinstance(f, _config_scope_hook.ConfigScopeFinder)]
    monkeypatch.setattr(sys, 'meta_path', [finder] + others)
    assert finder.find_spec('round12_other', None) is None
    importlib.import_module(trigger)
    assert log == ['exec', 'register']
    assert not finder._searching
    monkeypatch.delitem(sys.modules, trigger)


def test_hook_register_sets_module2package(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delitem(config_utils.MODULE2PACKAGE, 'mmlinvit')
    _config_scope_hook._register()
    assert config_utils.MODULE2PACKAGE['mmlinvit'] == 'mmlinvit'


# ------------------------------------------------------------------ log_forwarding
def _file_logger(tmp_path: Path, name: str, level: str) -> Path:
    from mmengine.logging import MMLogger
    log_file = tmp_path / f'{name}.log'
    MMLogger.get_instance(name, log_file=str(log_file), log_level=level)
    return log_file


def _flush_current() -> None:
    from mmengine.logging import MMLogger
    for handler in MMLogger.get_current_instance().handlers:
        handler.flush()


def test_forwarder_installs_once(monkeypatch: pytest.MonkeyPatch):
    logger = logging.getLogger(log_forwarding.LOGGER_NAME)
    monkeypatch.setattr(logger, 'handlers', list(logger.handlers))
    log_forwarding.install()
    log_forwarding.install()
    assert sum(isinstance(h, log_forwarding.MMLoggerForwarder) for h in logger.handlers) == 1


def test_user_level_on_info_logger_is_kept(monkeypatch: pytest.MonkeyPatch):
    name = log_forwarding.INFO_LOGGERS[0]
    monkeypatch.setattr(logging.getLogger(name), 'level', logging.ERROR)
    log_forwarding.install()
    assert logging.getLogger(name).level == logging.ERROR
    monkeypatch.setattr(logging.getLogger(name), 'level', logging.NOTSET)
    log_forwarding.install()
    assert logging.getLogger(name).level == logging.INFO


def test_forwarder_respects_the_file_handler_level(tmp_path: Path):
    """A WARNING-level run log gets WARNINGs, not INFO; an INFO-level one gets INFO."""
    log_file = _file_logger(tmp_path, 'round12_warning_only', 'WARNING')
    loading = logging.getLogger('mmlinvit.converters.loading')
    loading.info('round12 info record')
    loading.warning('round12 warning record')
    _flush_current()
    text = log_file.read_text()
    assert 'round12 warning record' in text and 'round12 info record' not in text
    info_file = _file_logger(tmp_path, 'round12_info', 'INFO')
    loading.info('round12 second info')
    _flush_current()
    assert info_file.read_text().count('round12 second info') == 1


# ------------------------------------------------------------------ utils.cli
def test_checkpoint_io_parser_sets_description_and_help():
    parser = checkpoint_io_parser('Round 12 tool.', ('src', 'the source file'),
                                  ('dst', 'the written file'))
    text = parser.format_help()
    assert 'Round 12 tool.' in text and 'the source file' in text and 'the written file' in text
    assert '--trust-checkpoint' not in text


def test_trust_flag_defaults_off_and_names_what():
    parser = argparse.ArgumentParser()
    add_trust_checkpoint_argument(parser)
    assert parser.parse_args([]).trust_checkpoint is False
    assert 'a file that holds Python objects' in ' '.join(parser.format_help().split())


def test_load_script_runs_the_file_and_does_not_cache_it(tmp_path: Path):
    path = _write(tmp_path / 'round12_tool.py', 'VALUE = 6 * 7\n')
    module = load_script(str(path), 'round12_tool_module')
    assert module.VALUE == 42 and module.__name__ == 'round12_tool_module'
    assert 'round12_tool_module' not in sys.modules


# ------------------------------------------------------------------ NameRegistry
class _Widget:
    def __init__(self, size: int = 1, colour: str = 'red') -> None:
        self.size, self.colour = size, colour


class _Gadget(_Widget):
    pass


def _registry() -> NameRegistry:
    registry = NameRegistry('strategy')
    registry.register_module(module=_Widget)
    registry.register_module('zeta', module=_Gadget)
    return registry


def test_register_uses_given_name_or_class_name():
    registry = _registry()
    assert registry.names == ['_Widget', 'zeta'] and registry.get('zeta') is _Gadget
    assert '_Gadget' not in registry and dict(registry.items()) == {'_Widget': _Widget,
                                                                    'zeta': _Gadget}

    @registry.register_module('decorated')
    class Decorated:
        pass

    assert registry.get('decorated') is Decorated and Decorated.__name__ == 'Decorated'


def test_register_same_class_again_is_allowed_other_class_is_not():
    registry = _registry()
    assert registry.register_module('zeta', module=_Gadget) is _Gadget
    with pytest.raises(KeyError, match=r"strategy 'zeta' is already registered to .*_Gadget"):
        registry.register_module('zeta', module=_Widget)
    assert registry.get('zeta') is _Gadget


def test_unknown_name_lists_registered_names_sorted_and_plural():
    registry = _registry()
    registry.register_module('alpha', module=type('Alpha', (), {}))
    with pytest.raises(KeyError) as info:
        registry.get('nope')
    assert "Unknown strategy 'nope'. Registered strategies: _Widget, alpha, zeta." in str(
        info.value)


@pytest.mark.parametrize('kind,plural', [('strategy', 'strategies'), ('key', 'keys'),
                                         ('relay', 'relays'), ('operator', 'operators')])
def test_plural(kind: str, plural: str):
    assert NameRegistry(kind).plural == plural


def test_get_accepts_the_mmlinvit_prefix_only_as_prefix():
    registry = _registry()
    assert registry.get('mmlinvit.zeta') is _Gadget
    with pytest.raises(KeyError, match="Unknown strategy 'xmmlinvit.zeta'"):
        registry.get('xmmlinvit.zeta')


def test_build_merges_defaults_under_the_config():
    registry = _registry()
    built = registry.build(dict(type='mmlinvit.zeta', size=5), size=2, colour='blue')
    assert isinstance(built, _Gadget) and (built.size, built.colour) == (5, 'blue')
    plain = registry.build('_Widget')
    assert type(plain) is _Widget and (plain.size, plain.colour) == (1, 'red')
    for bad in (dict(size=3), 3, None):
        with pytest.raises(TypeError, match='a dict with a "type" key'):
            registry.build(bad)


def test_build_does_not_change_the_config():
    registry = _registry()
    cfg: Dict[str, object] = dict(type='zeta', size=3)
    registry.build(cfg, colour='x')
    assert cfg == dict(type='zeta', size=3)


# ------------------------------------------------------------------ registry
def test_each_registry_is_a_child_of_the_same_named_mmengine_root():
    import mmengine.registry as root
    for name in ('MODELS', 'HOOKS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'DATASETS', 'DATA_SAMPLERS'):
        child = getattr(mmlinvit.registry, name)
        assert child.parent is getattr(root, name), name
        assert root.__dict__[name]._children['mmlinvit'] is child, name


def test_scope_that_only_starts_with_mmlinvit_is_mmengines(fake_mmlinvit: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    """``mmlinvit_extra::`` is another package's scope: mmengine tags it with its own name (not
    the base's declared default_scope, as for ``mmlinvit::``)."""
    monkeypatch.setitem(config_utils.MODULE2PACKAGE, 'mmlinvit_extra', FAKE_PACKAGE)
    assert Config._get_cfg_path('mmlinvit_extra::_base_/seg_scoped.py', 'x.py')[1] == \
        'mmlinvit_extra'
    assert Config._get_cfg_path('mmlinvit::_base_/seg_scoped.py', 'x.py')[1] == 'mmseg'


def test_no_last_resort_print_when_the_root_logger_has_a_handler(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """An application that configured logging gets each WARNING once (through its handler),
    not a second bare copy on stderr from Python's last-resort handler."""
    seen: List[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    root = logging.getLogger()
    monkeypatch.setattr(root, 'handlers', [_Collect()])
    logging.getLogger('mmlinvit.converters.loading').warning('round12 configured warning')
    assert seen == ['round12 configured warning']
    assert 'round12 configured warning' not in capsys.readouterr().err
    monkeypatch.setattr(root, 'handlers', [])
    logging.getLogger('mmlinvit.converters.loading').warning('round12 bare warning')
    assert capsys.readouterr().err.count('round12 bare warning') == 1


def test_only_the_load_report_logger_is_raised_to_info(tmp_path: Path):
    """INFO of ``mmlinvit.converters.loading`` reaches the run log; INFO of its siblings stays
    at the root's WARNING level (no flood of debug-ish records in the log file)."""
    assert logging.getLogger('mmlinvit.converters.loading').getEffectiveLevel() == logging.INFO
    assert logging.getLogger('mmlinvit.converters.round12_sibling').getEffectiveLevel() == \
        logging.getLogger().getEffectiveLevel()
    log_file = _file_logger(tmp_path, 'round12_sibling_info', 'INFO')
    logging.getLogger('mmlinvit.converters.round12_sibling').info('round12 sibling info')
    logging.getLogger('mmlinvit.converters.loading').info('round12 loading info')
    _flush_current()
    text = log_file.read_text()
    assert 'round12 loading info' in text
    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        assert 'round12 sibling info' not in text
