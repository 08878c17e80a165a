"""mmengine's ``CheckpointHook`` that never leaves a run without an intact checkpoint.

mmengine's hook, with ``max_keep_ckpts``, deletes the oldest kept checkpoint *before* it
writes the new one, writes the new one under its final name, and does the same with the
best checkpoint of ``save_best`` (the previous best is removed first).  A job killed
(preemption, OOM killer, wall time) or a disk that fills up while ``iter_N.pth`` or
``best_*.pth`` is written then leaves a truncated file and one checkpoint fewer; with
``max_keep_ckpts=1`` (the ViT-AdaLA Stage-1 config) nothing to resume from at all.  This hook
runs mmengine's saving code with two changes: each file is written as ``<name>.part`` and
renamed (an atomic ``os.replace``), and the files mmengine removes (rotated-out checkpoints,
the previous best) are removed only after the new file is in place.  A failed write removes
its ``.part`` file and leaves the earlier checkpoints as they were.  ``tools/train.py`` uses it
in place of mmengine's ``CheckpointHook`` (same arguments; see :mod:`mmlinvit.engine.launch`).

At the start of training it removes the ``*.pth.part`` files an earlier run of the work dir
left when it was killed (SIGKILL) while writing, naming them.  On resume it also says when
the training loop cannot continue where the checkpoint was taken: an epoch-based loop resumed
from a checkpoint taken inside an epoch (``by_epoch=False``) restarts that epoch from its
first batch.
"""
import contextlib
import logging
import os
import os.path as osp
from typing import Iterator, List

from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.optim import OptimWrapperDict
from mmengine.runner import EpochBasedTrainLoop

from mmlinvit.registry import HOOKS

#: Suffix of a checkpoint being written (not matched by ``*.pth`` globs).
PART_SUFFIX = '.part'
#: What this hook's unfinished writes end with (other ``.part`` files are not its own).
CHECKPOINT_PART_SUFFIX = '.pth' + PART_SUFFIX


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` (same arguments) whose saves are written, renamed, then rotated.

    Remote ``out_dir`` backends (no rename) keep mmengine's behaviour.
    """

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self._remove_stale_parts()
        self._warn_mid_epoch_resume(runner)
        self._warn_epoch_checkpoints_inside_windows(runner)

    def _remove_stale_parts(self) -> None:
        """Removes the ``*.pth.part`` files of this hook's ``out_dir`` (writes a killed run
        left; other ``.part`` files, e.g. a partial download, are not touched)."""
        if not isinstance(self.file_backend, LocalBackend) or not is_main_process() \
                or not osp.isdir(self.out_dir):
            return
        stale = sorted(name for name in os.listdir(self.out_dir)
                       if name.endswith(CHECKPOINT_PART_SUFFIX)
                       and osp.isfile(osp.join(self.out_dir, name)))
        for name in stale:
            os.remove(osp.join(self.out_dir, name))
        if stale:
            print_log(f'Removed {len(stale)} unfinished checkpoint write(s) an interrupted run '
                      f'left in {self.out_dir}: {stale}', logger='current',
                      level=logging.WARNING)

    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        with self._atomic_saves(runner):
            super()._save_checkpoint_with_step(runner, step, meta)

    def _save_best_checkpoint(self, runner, metrics) -> None:
        with self._atomic_saves(runner):
            super()._save_best_checkpoint(runner, metrics)

    @contextlib.contextmanager
    def _atomic_saves(self, runner) -> Iterator[None]:
        """Inside: ``runner.save_checkpoint`` writes ``.part`` files and renames them, and
        the removals of ``self.file_backend`` wait until the block has succeeded."""
        if not isinstance(self.file_backend, LocalBackend) or getattr(self, '_saving', False):
            yield  # a remote backend, or inside another save (already atomic)
            return
        backend, save = self.file_backend, runner.save_checkpoint
        removals: List[str] = []
        written: List[str] = []

        def save_then_rename(out_dir: str, filename: str, *args, **kwargs) -> None:
            final = osp.join(out_dir, filename)
            part = final + PART_SUFFIX
            try:
                save(out_dir, filename + PART_SUFFIX, *args, **kwargs)
                if is_main_process():
                    os.replace(part, final)
                    written.append(osp.normpath(final))
            except BaseException:
                if is_main_process() and osp.exists(part):
                    os.remove(part)
                raise

        backend.remove = removals.append
        backend.rmtree = removals.append
        runner.save_checkpoint = save_then_rename
        self._saving = True
        try:
            yield
        finally:
            self._saving = False
            del backend.remove, backend.rmtree  # the class's methods again
            del runner.save_checkpoint
        for path in removals:  # only after every new file is in place
            if osp.normpath(path) in written:  # re-saved under the same name
                continue
            if osp.isdir(path):  # deepspeed checkpoints are folders
                backend.rmtree(path)
            elif osp.exists(path):
                os.remove(path)

    def _warn_epoch_checkpoints_inside_windows(self, runner) -> None:
        """Warns when epoch checkpoints fall inside gradient-accumulation windows.

        mmengine's ``OptimWrapper`` carries an accumulation window over the epoch's end, so
        with ``accumulative_counts`` k not dividing the iterations per epoch an epoch
        checkpoint holds gradients not yet applied, which ``--resume`` loses (the
        iteration-interval case is warned from the config, :mod:`mmlinvit.engine.accumulation`).
        """
        loop = runner.train_loop
        if not self.by_epoch or not isinstance(loop, EpochBasedTrainLoop):
            return
        wrapper = runner.optim_wrapper
        wrappers = wrapper.values() if isinstance(wrapper, OptimWrapperDict) else [wrapper]
        counts = max((getattr(w, '_accumulative_counts', 1) for w in wrappers), default=1)
        per_epoch = len(loop.dataloader)
        if counts > 1 and per_epoch % counts:
            print_log(f'Epoch checkpoints with accumulative_counts={counts} and {per_epoch} '
                      f'iterations per epoch fall inside accumulation windows (mmengine carries '
                      f'a window over the end of an epoch): a --resume from one of them loses '
                      f'the gradients accumulated since the last optimizer step (resume is then '
                      f'not exact). Use a batch size / data set size that gives a multiple of '
                      f'{counts} iterations per epoch.', logger='current', level=logging.WARNING)

    @staticmethod
    def _warn_mid_epoch_resume(runner) -> None:
        """Warns when an epoch loop resumes from a checkpoint taken inside an epoch."""
        loop = runner.train_loop
        if not isinstance(loop, EpochBasedTrainLoop) or runner.iter == 0:
            return
        per_epoch = len(loop.dataloader)
        done_in_epoch = runner.iter - runner.epoch * per_epoch
        # done_in_epoch == per_epoch: an iteration checkpoint (by_epoch=False) taken at an
        # epoch's last iteration still names that epoch, which the loop trains again whole
        if per_epoch and 0 < done_in_epoch <= per_epoch:
            print_log(f'Resumed at iteration {runner.iter}, {done_in_epoch} of the '
                      f'{per_epoch} iterations of epoch {runner.epoch + 1}: mmengine\'s '
                      f'EpochBasedTrainLoop restarts an epoch from its first batch, so these '
                      f'{done_in_epoch} iterations are trained again and the run ends '
                      f'{done_in_epoch} iterations later than planned (the resume is not '
                      f'exact). Checkpoints of epoch-based runs resume exactly when taken at '
                      f'epoch ends (default_hooks.checkpoint.by_epoch=True).',
                      logger='current', level=logging.WARNING)
