"""Choosing the checkpoint ``tools/train.py --resume`` continues from, and checking it loads.

mmengine's auto-resume reads ``<work_dir>/last_checkpoint``; when it is missing (a mistyped
``--work-dir``) it logs "Auto resumed from the latest checkpoint None" and trains from
scratch, and when the file it names was cut short it fails with an error that names neither
the file nor the cause.  :func:`select_resume_checkpoint` instead

* fails, naming the work dir and what was looked for, when there is nothing to resume;
* falls back from a damaged latest checkpoint to the newest one whose file is intact
  (:func:`mmlinvit.converters.checkpoint_file.checkpoint_file_problem`), warning with both
  names.

:func:`resume_randomness` gives a resumed run the seed of the run it continues.  A config
without ``randomness.seed`` (every segmentation config) lets mmengine draw a new seed per
run; mmengine builds the train sampler with that new seed (``BaseLoop.__init__``) and adopts
the checkpoint's ``meta['seed']`` only later, in ``Runner.resume``, so the data order and the
per-sample augmentation seeds (:mod:`mmlinvit.engine.sample_seeding`) of the resumed part came
from a fresh seed.
"""
import glob
import logging
import os
import os.path as osp
import pickle
import re
from typing import Any, Dict, List, Optional, Tuple

import torch
from mmengine.logging import print_log
from mmengine.runner.checkpoint import get_torch_safe_globals

from mmlinvit.converters.checkpoint_file import (ZIP_MAGIC, CheckpointFileError,
                                                 check_checkpoint_file, checkpoint_file_problem)

from .preflight import is_remote_path

#: Names ``CheckpointHook`` gives checkpoints by default (``iter_<n>.pth`` / ``epoch_<n>.pth``).
NUMBERED_CHECKPOINT = re.compile(r'^(?:iter|epoch)_(\d+)\.pth$')


class ResumeError(FileNotFoundError):
    """``--resume`` found nothing it can resume from."""


def _step(path: str) -> int:
    found = NUMBERED_CHECKPOINT.match(osp.basename(path))
    return int(found.group(1)) if found else -1


def last_checkpoint_target(work_dir: str) -> Optional[str]:
    """The path ``<work_dir>/last_checkpoint`` names (written by ``CheckpointHook`` after each
    checkpoint), or None without one."""
    pointer = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(pointer):
        return None
    with open(pointer) as f:
        return f.read().strip() or None


def numbered_checkpoints(folder: str) -> List[str]:
    """The ``iter_*.pth`` / ``epoch_*.pth`` files of ``folder``, by increasing number."""
    return sorted((osp.normpath(p) for p in glob.glob(osp.join(glob.escape(folder), '*.pth'))
                   if NUMBERED_CHECKPOINT.match(osp.basename(p))), key=_step)


def resume_candidates(work_dir: str) -> Tuple[Optional[str], List[str], List[str]]:
    """The checkpoint ``last_checkpoint`` names and every numbered checkpoint, newest first.

    A numbered checkpoint with a higher number than the ``last_checkpoint`` target is newer
    only when it was also written later (the run was stopped between writing it and updating
    ``last_checkpoint``).  One written *before* the target comes from an earlier run into the
    same work dir (a fresh run overwrites only the numbers it reaches): it is left out.  So is
    any checkpoint written before one of a lower number (one run writes its numbers in
    increasing order), which matters when the target is damaged and an earlier one is resumed
    instead: another run's ``iter_4.pth`` is not taken over this run's ``iter_3.pth``.  Both
    rules read file times only where ``last_checkpoint`` names an existing local file.

    Args:
        work_dir: The run's work dir.

    Returns:
        (the path in ``<work_dir>/last_checkpoint`` or None, candidates newest first: the
        ``last_checkpoint`` target and the ``iter_*.pth`` / ``epoch_*.pth`` files of its
        folder and of the work dir, by decreasing number, the target first among equals;
        the left-out checkpoints of earlier runs).
    """
    latest = last_checkpoint_target(work_dir)
    folders = [work_dir] + ([osp.dirname(latest)] if latest else [])
    numbered = {path for folder in folders for path in numbered_checkpoints(folder)}
    if latest is not None:
        numbered.add(osp.normpath(latest))

    def mtime(path: str) -> float:
        return osp.getmtime(path) if osp.exists(path) else 0.0

    stale: List[str] = []
    if latest is not None and osp.exists(latest):
        written, step = mtime(latest), _step(latest)
        stale = [p for p in numbered if _step(p) > step >= 0 and mtime(p) < written]
        # one run writes its numbers in increasing order: a checkpoint written before one of
        # a lower number is an earlier run's (the target itself is never left out)
        stale += [p for p in numbered if p not in stale and p != osp.normpath(latest)
                  and _step(p) >= 0 and any(0 <= _step(q) < _step(p) and mtime(q) > mtime(p)
                                            for q in numbered)]  # a missing q: mtime 0
        stale.sort(key=_step)
        numbered -= set(stale)

    def newest_first(path: str) -> Tuple[float, bool, float]:
        is_latest = latest is not None and path == osp.normpath(latest)
        step = _step(path)
        return (float('inf') if is_latest and step < 0 else step), is_latest, mtime(path)

    ordered = sorted(numbered, key=newest_first, reverse=True)
    return latest, ordered, stale


def select_resume_checkpoint(work_dir: str) -> str:
    """The newest intact checkpoint of ``work_dir`` (``--resume`` without a path).

    Args:
        work_dir: The run's work dir.

    Returns:
        The checkpoint path.

    Raises:
        ResumeError: when the work dir holds no checkpoint, or none is intact.
    """
    where = osp.abspath(work_dir)
    looked_for = (f"looked for {osp.join(where, 'last_checkpoint')} (written by CheckpointHook "
                  f"next to every checkpoint) and {osp.join(where, 'iter_*.pth')} / "
                  f"{osp.join(where, 'epoch_*.pth')}")
    advice = ('Check --work-dir (default: ./work_dirs/<config name>), pass the checkpoint '
              'itself (--resume PATH), or drop --resume to start from scratch.')
    if not osp.isdir(where):
        raise ResumeError(f'--resume: nothing to resume, the work dir {where} does not exist '
                          f'({looked_for}). {advice}')
    named = last_checkpoint_target(where)
    if named is not None and is_remote_path(named):
        # CheckpointHook(out_dir='s3://...'): mmengine reads it through its file backend
        print_log(f'--resume: resuming from {named} (named by last_checkpoint); a remote '
                  f'checkpoint is not checked before loading.', logger='current',
                  level=logging.INFO)
        return named
    latest, candidates, stale = resume_candidates(where)
    if stale:
        print_log(f'--resume: {where} also holds {", ".join(osp.basename(p) for p in stale)}, '
                  f'written before {latest} (named by last_checkpoint) or before a checkpoint '
                  f'of a lower number: '
                  f'checkpoints of an earlier run into the same work dir, not resumed. Give '
                  f'each run its own --work-dir.', logger='current', level=logging.WARNING)
    if not candidates:
        content = sorted(os.listdir(where))[:10]
        raise ResumeError(f'--resume: nothing to resume in {where}: no checkpoint found '
                          f'({looked_for}; the folder holds {content or "nothing"}). {advice}')
    problems = []
    for path in candidates:
        problem = checkpoint_file_problem(path)
        if problem is None:
            break
        problems.append(f'{path} {problem}')
    else:
        raise ResumeError('--resume: no checkpoint of ' + where + ' can be loaded:\n  ' +
                          '\n  '.join(problems) + '\nRestart from scratch without --resume, '
                          'or pass an intact checkpoint with --resume PATH.')
    if problems:
        print_log(f'--resume: the latest checkpoint cannot be loaded: {problems[0]}. Resuming '
                  f'from {path} instead, the newest checkpoint that is intact; the iterations '
                  f'after it are trained again.' +
                  (f' Also skipped: {"; ".join(problems[1:])}.' if len(problems) > 1 else ''),
                  logger='current', level=logging.WARNING)
    elif latest is not None and osp.normpath(path) != osp.normpath(latest):
        print_log(f'--resume: {path} is newer than {latest} named by last_checkpoint; resuming '
                  f'from {path}.', logger='current', level=logging.WARNING)
    return path


def check_resume_or_load_from(resume: bool, load_from: Optional[str], work_dir: str,
                              ) -> Optional[str]:
    """Resolves and checks what a training run loads: the path to resume / load, or None.

    Args:
        resume: ``cfg.resume``.
        load_from: ``cfg.load_from`` (with ``resume``: an explicit ``--resume PATH``).
        work_dir: ``cfg.work_dir``.

    Returns:
        The checkpoint to pass as ``cfg.load_from`` (unchanged when given).

    Raises:
        ResumeError: nothing to resume.
        CheckpointFileError: an explicit checkpoint is damaged.
    """
    if resume and load_from is None:
        return select_resume_checkpoint(work_dir)
    if not resume and osp.isdir(work_dir):
        earlier = numbered_checkpoints(work_dir)
        if earlier:
            print_log(f'{osp.abspath(work_dir)} already holds checkpoints of an earlier run '
                      f'({", ".join(osp.basename(p) for p in earlier[-3:])}); this run starts '
                      f'from scratch (no --resume) and overwrites only the ones it reaches, so '
                      f'the folder will mix both runs. Give each run its own --work-dir, or '
                      f'add --resume to continue the earlier run.',
                      logger='current', level=logging.WARNING)
    if load_from is not None and _is_local(load_from):
        try:
            check_checkpoint_file(load_from)
        except CheckpointFileError as err:
            flag = '--resume' if resume else 'load_from'
            raise CheckpointFileError(f'{flag}: {err}') from None
    return load_from


def _is_local(path: str) -> bool:
    return not is_remote_path(path)


def checkpoint_meta(path: str) -> Dict[str, Any]:
    """The ``meta`` dict of a runner checkpoint, without reading its tensors into memory.

    A ``torch.save`` zip archive is memory-mapped (``mmap=True``), so only the pickle record
    is read.  It is unpickled as ``Runner.resume`` does it (mmengine's ``_safe_torch_load``):
    ``weights_only=True`` with mmengine's allowlist (numpy arrays, ``HistoryBuffer``), and a
    full unpickle of a file that holds other objects, which the runner performs on the same
    file right after.

    Args:
        path: A local checkpoint written by mmengine's ``Runner``.

    Returns:
        ``checkpoint['meta']`` (empty when the file has none).
    """
    with open(path, 'rb') as f:
        mmap = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC  # legacy torch files cannot be mapped
    try:
        with torch.serialization.safe_globals(get_torch_safe_globals()):
            checkpoint = torch.load(path, map_location='cpu', weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        checkpoint = torch.load(path, map_location='cpu', weights_only=False, mmap=mmap)
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    return dict(meta) if isinstance(meta, dict) else {}


def resume_randomness(randomness: Optional[Dict[str, Any]], checkpoint: str) -> Dict[str, Any]:
    """The ``randomness`` config of a run resumed from ``checkpoint``.

    * The config sets no seed (``randomness`` absent, or its ``seed`` None): the seed of the
      interrupted run, ``meta['seed']`` of the checkpoint, is used (INFO log line), so the
      sampler and the per-sample augmentation streams are built with it and the resumed run
      continues exactly.
    * The config sets another seed than the checkpoint's: a warning names both; the config's
      seed is kept, and the resume is not exact.
    * The checkpoint is remote or has no seed: a warning says the resume is not exact and how
      to make it so.

    Other keys (``diff_rank_seed``, ``deterministic``) are kept.

    Args:
        randomness: ``cfg.randomness`` (None when the config has none).
        checkpoint: The checkpoint the run resumes from.

    Returns:
        A new ``randomness`` dict.
    """
    randomness = dict(randomness or {})
    config_seed = randomness.get('seed', None)
    if not _is_local(checkpoint):
        if config_seed is None:
            print_log(f'--resume: cannot read the seed of the interrupted run from the remote '
                      f'checkpoint {checkpoint} before the runner is built; a new seed is drawn, '
                      f'so the data order and random augmentation after the resumed iteration '
                      f"differ from the interrupted run. Set randomness.seed to its seed "
                      f"(meta['seed'] of the checkpoint) for an exact resume.",
                      logger='current', level=logging.WARNING)
        return dict(randomness, seed=config_seed)
    stored = checkpoint_meta(checkpoint).get('seed', None)
    if stored is None:
        if config_seed is None:
            print_log(f"--resume: {checkpoint} records no seed (meta['seed']) and the config "
                      f'sets no randomness.seed: a new seed is drawn, so the data order and '
                      f'random augmentation after the resumed iteration differ from the '
                      f'interrupted run.', logger='current', level=logging.WARNING)
        return dict(randomness, seed=config_seed)
    stored = int(stored)
    if config_seed is None:
        print_log(f'--resume: the config sets no randomness.seed; using seed {stored} of the '
                  f"interrupted run (meta['seed'] of {checkpoint}), so the data order and "
                  f'random augmentation continue as in that run.', logger='current',
                  level=logging.INFO)
        return dict(randomness, seed=stored)
    if int(config_seed) != stored:
        print_log(f'--resume: the config sets randomness.seed={config_seed} but the '
                  f"interrupted run used seed {stored} (meta['seed'] of {checkpoint}); "
                  f'keeping {config_seed}, so the data order and random augmentation after the '
                  f'resumed iteration differ from the interrupted run: the resume is not exact. '
                  f'Set randomness.seed={stored} (or remove it) to continue exactly.',
                  logger='current', level=logging.WARNING)
    return randomness


#: Config entries whose change between the interrupted and the resumed run does not do what
#: it says, with what happens instead.
_RESUME_SENSITIVE = (
    (('optim_wrapper', 'optimizer'), 'the optimizer state (lr, weight decay, momenta) is '
                                     "restored from the checkpoint: the new values are not used"),
    (('param_scheduler',), "the schedulers' state (begin, end, factors) is restored from the "
                           'checkpoint: the new schedule is not used'),
    (('train_cfg', 'max_iters'), 'the loop runs to the new length, the restored schedulers '
                                 'keep the old end'),
    (('train_cfg', 'max_epochs'), 'the loop runs to the new length, the restored schedulers '
                                  'keep the old end'),
    (('train_dataloader', 'batch_size'), 'the sampler skips iterations x the new batch size: '
                                         'the data order no longer continues the interrupted run'),
    (('optim_wrapper', 'accumulative_counts'), 'optimizer steps no longer fall where the '
                                               'interrupted run had them'),
)


def _lookup(cfg: Any, keys: Tuple[str, ...]) -> Any:
    node = cfg
    for key in keys:  # Config and ConfigDict both have .get
        node = node.get(key) if hasattr(node, 'get') else None
        if node is None:
            return None
    return node


def _plain(value: Any) -> Any:
    """Config values as plain Python (ConfigDict / tuples), for comparison."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _differences(old: Any, new: Any, name: str) -> List[str]:
    """``'name.key: old -> new'`` for each differing entry of two dicts (else the values)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: List[str] = []
        for key in sorted(set(old) | set(new), key=str):
            if old.get(key) != new.get(key):
                out += _differences(old.get(key), new.get(key), f'{name}.{key}')
        return out
    return [f'{name}: {old!r} -> {new!r}']


def _has_ema_hook(cfg: Any) -> bool:
    """Whether ``custom_hooks`` holds mmengine's ``EMAHook`` (or a subclass)."""
    from mmengine.hooks import EMAHook
    from mmengine.registry import HOOKS
    scope = cfg.get('default_scope', None)
    for hook in cfg.get('custom_hooks', None) or []:
        kind = hook.get('type') if hasattr(hook, 'get') else None
        if isinstance(kind, str):
            # a name without a scope is looked up in the config's default scope first, as
            # the runner builds it (a subclass registered in mmseg / mmpretrain / a project)
            names = [f'{scope}.{kind}', kind] if scope and '.' not in kind else [kind]
            kind = next((found for found in map(HOOKS.get, names) if found is not None), None)
        if isinstance(kind, type) and issubclass(kind, EMAHook):
            return True
    return False


def warn_changed_resume_config(cfg: Any, checkpoint: str) -> List[str]:
    """Warns about entries of ``cfg`` that differ from the interrupted run's config.

    mmengine's ``Runner.resume`` restores the optimizer and the parameter schedulers from the
    checkpoint, so a learning rate, weight decay or schedule changed for the resumed run is
    silently not used; a changed ``max_iters`` runs past the restored schedule's end, and a
    changed batch size moves the data stream; a removed ``EMAHook`` continues from the
    averaged weights instead of the trained ones.  The interrupted run's config is the text
    mmengine stores in the checkpoint (``meta['cfg']``); checkpoints without it (or remote
    ones) are not compared.

    Args:
        cfg: The config of the resumed run.
        checkpoint: The checkpoint it resumes from.

    Returns:
        The dotted names of the changed entries (also logged as one warning).
    """
    if not _is_local(checkpoint):
        return []
    text = checkpoint_meta(checkpoint).get('cfg')
    if not isinstance(text, str):
        return []
    from mmengine.config import Config
    try:
        before = Config.fromstring(text, '.py')
    except Exception as err:  # an interrupted run's config that no longer parses
        print_log(f'--resume: the config stored in {checkpoint} cannot be read ({err}); not '
                  f'compared with this run\'s.', logger='current', level=logging.INFO)
        return []
    changed, lines = [], []
    for keys, effect in _RESUME_SENSITIVE:
        old, new = _plain(_lookup(before, keys)), _plain(_lookup(cfg, keys))
        if old != new:
            name = '.'.join(keys)
            changed.append(name)
            diffs = _differences(old, new, name)
            lines.append('; '.join(diffs) + f' ({effect})')
    if _has_ema_hook(before) and not _has_ema_hook(cfg):
        changed.append('custom_hooks.EMAHook')
        lines.append('custom_hooks: EMAHook removed (the checkpoint\'s state_dict holds the '
                     'averaged weights, its ema_state_dict the trained ones, which EMAHook '
                     'swaps back on resume: without it the run continues from the averaged '
                     'weights with the optimizer state of the trained ones; keep the EMAHook '
                     'to continue exactly)')
    if changed:
        print_log(f'--resume: this config differs from the interrupted run\'s (stored in '
                  f'{checkpoint}):\n  ' + '\n  '.join(lines) + '\nTo train these weights with '
                  f'the new settings, start a new run from them instead: load_from={checkpoint} '
                  f'without --resume (weights only; optimizer and schedule start anew).',
                  logger='current', level=logging.WARNING)
    return changed
