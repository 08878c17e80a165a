"""mmengine's ``CheckpointHook`` that never leaves a run without an intact checkpoint.

mmengine's hook, with ``max_keep_ckpts``, deletes the oldest kept checkpoint *before* it
writes the new one, and writes the new one under its final name.  A job killed (preemption,
OOM killer, wall time) or a disk that fills up while ``iter_N.pth`` is written then leaves a
truncated ``iter_N.pth`` and one checkpoint fewer; with ``max_keep_ckpts=1`` (the ViT-AdaLA
Stage-1 config) nothing to resume from at all.  This hook writes ``<name>.part`` and renames
it (an atomic ``os.replace``), points ``last_checkpoint`` at it the same way, and only then
removes the checkpoints ``max_keep_ckpts`` rotates out.  A failed write removes its ``.part``
file and leaves the earlier checkpoints as they were.  ``tools/train.py`` uses it in place
of mmengine's ``CheckpointHook`` (same arguments; see :mod:`mmlinvit.engine.launch`).

On resume it also says when the training loop cannot continue where the checkpoint was
taken: an epoch-based loop resumed from a checkpoint taken inside an epoch
(``by_epoch=False``) restarts that epoch from its first batch.
"""
import logging
import os
import os.path as osp
from typing import Optional

from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.runner import EpochBasedTrainLoop

from mmlinvit.registry import HOOKS

#: Suffix of a checkpoint being written (not matched by ``*.pth`` globs).
PART_SUFFIX = '.part'


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` (same arguments) that writes, renames, then rotates.

    Remote ``out_dir`` backends (no rename) keep mmengine's behaviour.
    """

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self._warn_mid_epoch_resume(runner)

    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        if not isinstance(self.file_backend, LocalBackend):
            return super()._save_checkpoint_with_step(runner, step, meta)
        rotated_out: Optional[int] = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids
                                             and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                rotated_out = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        filename = self.filename_tmpl.format(step)
        final = self.file_backend.join_path(self.out_dir, filename)
        part = final + PART_SUFFIX
        self.last_ckpt = final
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        try:
            runner.save_checkpoint(
                self.out_dir,
                filename + PART_SUFFIX,
                self.file_client_args,
                save_optimizer=self.save_optimizer,
                save_param_scheduler=self.save_param_scheduler,
                meta=meta,
                by_epoch=self.by_epoch,
                backend_args=self.backend_args,
                **self.args)
            if is_main_process():
                os.replace(part, final)
        except BaseException:
            if is_main_process() and osp.exists(part):
                os.remove(part)
            raise
        if not is_main_process():
            return
        pointer = osp.join(runner.work_dir, 'last_checkpoint')
        with open(pointer + PART_SUFFIX, 'w') as f:
            f.write(self.last_ckpt)
        os.replace(pointer + PART_SUFFIX, pointer)
        if rotated_out is not None:
            old = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(rotated_out))
            if osp.isfile(old):
                os.remove(old)
            elif osp.isdir(old):  # deepspeed checkpoints are folders
                self.file_backend.rmtree(old)

    @staticmethod
    def _warn_mid_epoch_resume(runner) -> None:
        """Warns when an epoch loop resumes from a checkpoint taken inside an epoch."""
        loop = runner.train_loop
        if not isinstance(loop, EpochBasedTrainLoop) or runner.iter == 0:
            return
        per_epoch = len(loop.dataloader)
        done_in_epoch = runner.iter - runner.epoch * per_epoch
        if per_epoch and 0 < done_in_epoch < per_epoch:
            print_log(f'Resumed at iteration {runner.iter}, {done_in_epoch} of the '
                      f'{per_epoch} iterations of epoch {runner.epoch + 1}: mmengine\'s '
                      f'EpochBasedTrainLoop restarts an epoch from its first batch, so these '
                      f'{done_in_epoch} iterations are trained again and the run ends '
                      f'{done_in_epoch} iterations later than planned (the resume is not '
                      f'exact). Checkpoints of epoch-based runs resume exactly when taken at '
                      f'epoch ends (default_hooks.checkpoint.by_epoch=True).',
                      logger='current', level=logging.WARNING)
