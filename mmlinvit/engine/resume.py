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

#: Names ``CheckpointHook`` gives checkpoints by default (``iter_<n>.pth`` / ``epoch_<n>.pth``).
NUMBERED_CHECKPOINT = re.compile(r'^(?:iter|epoch)_(\d+)\.pth$')


class ResumeError(FileNotFoundError):
    """``--resume`` found nothing it can resume from."""


def _step(path: str) -> int:
    found = NUMBERED_CHECKPOINT.match(osp.basename(path))
    return int(found.group(1)) if found else -1


def resume_candidates(work_dir: str) -> Tuple[Optional[str], List[str]]:
    """The checkpoint ``last_checkpoint`` names and every numbered checkpoint, newest first.

    Args:
        work_dir: The run's work dir.

    Returns:
        (the path in ``<work_dir>/last_checkpoint`` or None, candidates newest first: the
        ``last_checkpoint`` target and the ``iter_*.pth`` / ``epoch_*.pth`` files of its
        folder and of the work dir, by decreasing number; the target first among equals).
    """
    latest = None
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            latest = f.read().strip() or None
    folders = [work_dir] + ([osp.dirname(latest)] if latest else [])
    numbered = set()
    for folder in folders:
        for path in glob.glob(osp.join(folder, '*.pth')):
            if NUMBERED_CHECKPOINT.match(osp.basename(path)):
                numbered.add(osp.normpath(path))
    if latest is not None:
        numbered.add(osp.normpath(latest))

    def newest_first(path: str) -> Tuple[float, bool, float]:
        is_latest = latest is not None and path == osp.normpath(latest)
        step = _step(path)
        mtime = osp.getmtime(path) if osp.exists(path) else 0.0
        return (float('inf') if is_latest and step < 0 else step), is_latest, mtime

    ordered = sorted(numbered, key=newest_first, reverse=True)
    return latest, ordered


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
    latest, candidates = resume_candidates(where)
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
    if load_from is not None and _is_local(load_from):
        try:
            check_checkpoint_file(load_from)
        except CheckpointFileError as err:
            flag = '--resume' if resume else 'load_from'
            raise CheckpointFileError(f'{flag}: {err}') from None
    return load_from


def _is_local(path: str) -> bool:
    return '://' not in path and not path.startswith(('open-mmlab:', 'mmcls:', 'torchvision:'))


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
