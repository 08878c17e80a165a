"""Choosing the checkpoint ``tools/train.py --resume`` continues from, and checking it loads.

mmengine's auto-resume reads ``<work_dir>/last_checkpoint``; when it is missing (a mistyped
``--work-dir``) it logs "Auto resumed from the latest checkpoint None" and trains from
scratch, and when the file it names was cut short it fails with an error that names neither
the file nor the cause.  :func:`select_resume_checkpoint` instead

* fails, naming the work dir and what was looked for, when there is nothing to resume;
* falls back from a damaged latest checkpoint to the newest one whose file is intact
  (:func:`mmlinvit.converters.checkpoint_file.checkpoint_file_problem`), warning with both
  names.
"""
import glob
import logging
import os
import os.path as osp
import re
from typing import List, Optional, Tuple

from mmengine.logging import print_log

from mmlinvit.converters.checkpoint_file import (CheckpointFileError, check_checkpoint_file,
                                                 checkpoint_file_problem)

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
    if load_from is not None and '://' not in load_from and not load_from.startswith(
            ('open-mmlab:', 'mmcls:', 'torchvision:')):
        try:
            check_checkpoint_file(load_from)
        except CheckpointFileError as err:
            flag = '--resume' if resume else 'load_from'
            raise CheckpointFileError(f'{flag}: {err}') from None
    return load_from
