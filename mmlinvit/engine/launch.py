"""What ``tools/train.py`` / ``tools/test.py`` do between parsing flags and ``runner.train()``.

The same tools serve segmentation (``default_scope='mmseg'``) and classification
(``default_scope='mmpretrain'``) configs: :data:`WORLDS` holds what differs between the two
(visualisation hooks), keyed by the config's ``default_scope``.

CPU support: without CUDA, :func:`adapt_to_device` turns ``SyncBN`` into ``BN`` (SyncBN has no
CPU kernel), selects the ``gloo`` backend and wraps the model in
``MMDistributedDataParallel`` without ``device_ids`` (mmengine's default passes the local GPU
index), so ``tools/dist_train.sh`` runs on CPU machines too.
"""
import argparse
import copy
import dataclasses
import ipaddress
import logging
import os
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config, ConfigDict, DictAction
from mmengine.hooks import CheckpointHook
from mmengine.logging import MMLogger, print_log
from mmengine.runner import Runner

from mmlinvit.config_scopes import register_config_scopes
from mmlinvit.converters.checkpoint_file import CheckpointFileError, check_checkpoint_file
from mmlinvit.utils.config_types import config_type_name

from .accumulation import AmpDeviceError, adapt_to_accumulation, check_amp_device
from .preflight import check_inputs, clear_checkpoints
from .resume import check_resume_or_load_from, resume_randomness, warn_changed_resume_config

#: ``--launcher`` choices (mmengine's).
LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')

#: Runners built by :func:`build_runner` in this process (see :func:`_distinct_experiment_name`).
_runners_built = 0


def add_launch_arguments(parser: argparse.ArgumentParser, cfg_options_example: str) -> None:
    """Adds the flags train.py and test.py share: ``--cfg-options``, ``--launcher``, ``--local-rank``.

    Args:
        parser: The tool's parser.
        cfg_options_example: Example overrides shown in ``--cfg-options``'s help.
    """
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help=f'override config keys, e.g. {cfg_options_example}')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def parse_launch_args(parser: argparse.ArgumentParser,
                      argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parses ``argv`` and exports ``--local-rank`` as ``LOCAL_RANK`` unless a launcher set it.

    A process started as one of several (``WORLD_SIZE`` > 1: torchrun, torch.distributed.launch)
    with ``--launcher none`` is refused: every process would train the whole run alone, on the
    same batches, and write the same checkpoints, with exit status 0.
    """
    args = parser.parse_args(argv)
    world_size = os.environ.get('WORLD_SIZE', '1')
    if args.launcher == 'none' and world_size.isdigit() and int(world_size) > 1:
        parser.error(f'this process is one of WORLD_SIZE={world_size} started by a launcher '
                     f'(torchrun), but --launcher is none: each process would run the whole '
                     f'training alone on the same batches and write the same files. Add '
                     f'--launcher pytorch (bash tools/dist_train.sh CONFIG N does).')
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    _export_launcher_world_size(args.launcher)
    _check_slurm_master_addr(parser, args.launcher)
    if args.launcher != 'none' and _launcher_rank(args.launcher) > 0:
        _quiet_before_runner()
    return args


# where each launcher puts the process's global rank before the process group exists
_RANK_VARIABLES = {'pytorch': 'RANK', 'slurm': 'SLURM_PROCID', 'mpi': 'OMPI_COMM_WORLD_RANK'}


# where each launcher puts the number of processes (mmengine copies it to WORLD_SIZE when it
# initialises the process group, after the checks that count iterations per epoch)
_WORLD_SIZE_VARIABLES = {'slurm': 'SLURM_NTASKS', 'mpi': 'OMPI_COMM_WORLD_SIZE'}


def _export_launcher_world_size(launcher: str) -> None:
    """Sets ``WORLD_SIZE`` from the Slurm / MPI launcher's variable, as mmengine's
    ``init_dist`` does later, so that the checks run before it count the processes.

    An exported ``WORLD_SIZE`` is replaced, as mmengine replaces it (``srun`` and ``mpirun``
    pass the shell's environment on: a stale value would make the checks count another number
    of processes than the run)."""
    variable = _WORLD_SIZE_VARIABLES.get(launcher)
    value = os.environ.get(variable, '') if variable else ''
    if value.isdigit():
        os.environ['WORLD_SIZE'] = value


def _is_loopback(address: str) -> bool:
    """Whether ``address`` names the local machine only.

    ``localhost`` (and ``*.localhost``), every address of 127.0.0.0/8 (Debian and Ubuntu map
    the machine's own name to 127.0.1.1), ``::1``, an IPv4-mapped loopback address, and the
    unspecified ``0.0.0.0`` / ``::``; a bracketed IPv6 address is read without its brackets.
    """
    name = address.strip().lower()
    if name.startswith('[') and name.endswith(']'):
        name = name[1:-1]
    if name == 'localhost' or name.endswith('.localhost'):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(ip, 'ipv4_mapped', None)
    if mapped is not None:
        ip = mapped
    return ip.is_loopback or ip.is_unspecified


def _check_slurm_master_addr(parser: argparse.ArgumentParser, launcher: str) -> None:
    """Refuses a loopback ``MASTER_ADDR`` exported into a Slurm job on several nodes.

    mmengine's Slurm set-up keeps an exported ``MASTER_ADDR`` instead of the job's first node
    (``srun`` passes the shell's environment on): with a loopback address the processes of the
    other nodes wait for a rendezvous on their own machine, and the job hangs without a word.
    """
    if launcher != 'slurm':
        return
    nodes = os.environ.get('SLURM_NNODES', os.environ.get('SLURM_JOB_NUM_NODES', '1'))
    address = os.environ.get('MASTER_ADDR', '')
    if nodes.isdigit() and int(nodes) > 1 and _is_loopback(address):
        parser.error(f'MASTER_ADDR={address} is exported into a Slurm job on {nodes} nodes: '
                     f'mmengine keeps it instead of the job\'s first node, and the other nodes '
                     f'would wait for {address} on their own machine (the job hangs). Run '
                     f'`unset MASTER_ADDR` before sbatch / srun (tools/slurm_train.sh).')


def _launcher_rank(launcher: str) -> int:
    """The global rank the launcher gave this process (0 when it names none)."""
    value = os.environ.get(_RANK_VARIABLES.get(launcher, 'RANK'), '0')
    return int(value) if value.isdigit() else 0


def _quiet_before_runner() -> None:
    """Shows only errors of the current MMLogger on a rank other than 0 until the runner exists.

    The config and data checks run before the process group and the runner's logger do, so
    mmengine cannot tell the ranks apart yet: each of N processes printed every check and
    warning.  The runner's own logger then does the same as this (rank > 0: errors only).
    """
    for handler in MMLogger.get_current_instance().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler,
                                                                         logging.FileHandler):
            handler.setLevel(logging.ERROR)


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Reads a config file and merges ``--cfg-options`` overrides into it.

    ``mmseg::`` / ``mmpretrain::`` / ``mmdet::`` / ``mmlinvit::`` bases resolve
    (:func:`mmlinvit.config_scopes.register_config_scopes`).
    """
    register_config_scopes()
    cfg = Config.fromfile(path)
    if cfg_options is not None:
        cfg.merge_from_dict(cfg_options)
    return cfg


@dataclasses.dataclass(frozen=True)
class World:
    """Library-specific behaviour of the tools.

    Args:
        scope: The ``default_scope`` that selects this world.
        task: What the world's models do, for messages.
        enable_visualization: ``fn(cfg, show_dir, show, wait_time, interval)`` switching on
            the world's visualisation hook for ``tools/test.py --show-dir/--show``.
        enable_output_dump: ``fn(cfg, out)`` routing ``tools/test.py --out`` to the world's
            way of saving raw predictions.
    """

    scope: str
    task: str
    enable_visualization: Callable[[Config, Optional[str], bool, float, int], None]
    enable_output_dump: Callable[[Config, str], None]


def _visualization_hook(cfg: Config, hook_type: str) -> dict:
    """``cfg.default_hooks.visualization`` (to edit in place), or a ToolConfigError with the fix."""
    hooks = cfg.get('default_hooks', None) or {}
    if 'visualization' not in hooks:
        raise ToolConfigError("--show/--show-dir need default_hooks.visualization "
                              f"(type='{hook_type}') in the config")
    return hooks['visualization']


def _seg_visualization(cfg: Config, show_dir: Optional[str], show: bool, wait_time: float,
                       interval: int) -> None:
    hook = _visualization_hook(cfg, 'SegVisualizationHook')
    hook['draw'] = True
    hook['interval'] = interval
    if interval != 1 and hook.get('type') in ('SegVisualizationHook',
                                              'mmseg.SegVisualizationHook'):
        hook['type'] = 'mmlinvit.SegVisualizationHook'  # mmseg's draws every test sample
    if show:
        hook['show'] = True
        hook['wait_time'] = wait_time
    if show_dir:
        cfg.visualizer['save_dir'] = show_dir


def _cls_visualization(cfg: Config, show_dir: Optional[str], show: bool, wait_time: float,
                       interval: int) -> None:
    hook = _visualization_hook(cfg, 'VisualizationHook')
    hook['enable'] = True
    hook['show'] = show
    hook['wait_time'] = wait_time
    hook['out_dir'] = show_dir
    hook['interval'] = interval


#: mmseg metrics that write label maps to ``output_dir`` (``--out``; CityscapesMetric: the
#: test server's format).
SEG_OUTPUT_METRICS = ('IoUMetric', 'CityscapesMetric')


def _seg_output_dump(cfg: Config, out: str) -> None:
    evaluators = cfg.test_evaluator
    metrics = [m for m in (evaluators if isinstance(evaluators, (list, tuple)) else [evaluators])
               if isinstance(m, dict)
               and config_type_name(m.get('type')) in SEG_OUTPUT_METRICS]
    if not metrics:
        raise EvaluationFlagError(f'--out DIR saves the label maps through mmseg\'s '
                                  f'{" / ".join(SEG_OUTPUT_METRICS)} (output_dir); '
                                  f'test_evaluator has none')
    for metric in metrics:
        metric['output_dir'] = out
        metric['keep_results'] = True
    # Every process writes its share of the maps: mmseg's IoUMetric creates the folder on
    # rank 0 only, and another rank's first write could come before it.
    os.makedirs(out, exist_ok=True)


def _cls_output_dump(cfg: Config, out: str) -> None:
    evaluators = cfg.test_evaluator
    evaluators = list(evaluators) if isinstance(evaluators, (list, tuple)) else [evaluators]
    cfg.test_evaluator = evaluators + [dict(type='DumpResults', out_file_path=out)]


#: Worlds the tools know, keyed by ``default_scope``.
WORLDS: Dict[str, World] = {
    'mmseg': World('mmseg', 'semantic segmentation', _seg_visualization, _seg_output_dump),
    'mmpretrain': World('mmpretrain', 'image classification', _cls_visualization,
                        _cls_output_dump),
}


def world_of(cfg: Config) -> World:
    """The :class:`World` selected by ``cfg.default_scope``.

    Args:
        cfg: The loaded config.

    Returns:
        The world.
    """
    scope = cfg.get('default_scope', None)
    if scope not in WORLDS:
        raise ToolConfigError(f'default_scope={scope!r} is not supported by mmlinvit tools; '
                              f'use one of {sorted(WORLDS)} (inherit '
                              f'configs/_base_/default_runtime_seg.py for segmentation or an '
                              f'mmpretrain runtime for classification)')
    return WORLDS[scope]


def replace_sync_bn(node: Any) -> int:
    """Turns every ``SyncBN`` norm config under ``node`` into ``BN``; returns the count."""
    count = 0
    if isinstance(node, dict):
        if node.get('type') in ('SyncBN', 'MMSyncBN'):
            node['type'] = 'BN'
            count += 1
        for value in node.values():
            count += replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += replace_sync_bn(value)
    return count


def adapt_to_device(cfg: Config, launcher: str = 'none') -> None:
    """Makes a GPU config runnable on CPU-only machines (no-op when CUDA is available).

    Args:
        cfg: The config, changed in place.
        launcher: The ``--launcher`` value.
    """
    if torch.cuda.is_available():
        return
    replaced = replace_sync_bn(cfg.get('model', {}))
    if replaced:
        several = (' (BN statistics are then those of each process\'s batch, not of the '
                   'global batch; the running statistics are averaged over the processes '
                   'before checkpoints and validation)' if launcher != 'none' else '')
        print_log(f'No CUDA device: replaced {replaced} SyncBN layer config(s) by BN{several}',
                  logger='current', level=logging.WARNING)
    if cfg.get('env_cfg', None) is None:
        cfg.env_cfg = ConfigDict()
    cfg.env_cfg['cudnn_benchmark'] = False
    if launcher != 'none':
        if cfg.env_cfg.get('dist_cfg', None) is None:
            cfg.env_cfg['dist_cfg'] = ConfigDict()
        cfg.env_cfg['dist_cfg']['backend'] = 'gloo'
        if not cfg.get('model_wrapper_cfg', None):
            cfg.model_wrapper_cfg = dict(
                type='MMDistributedDataParallel',
                device_ids=None,  # mmengine otherwise passes [LOCAL_RANK]; CPU DDP refuses it
                broadcast_buffers=False,
                find_unused_parameters=cfg.get('find_unused_parameters', False))


def prepare_train_config(cfg: Config,
                         config_path: str,
                         work_dir: Optional[str] = None,
                         resume: Optional[str] = None,
                         amp: bool = False,
                         launcher: str = 'none',
                         auto_scale_lr: bool = False,
                         no_validate: bool = False,
                         pin_memory: bool = True,
                         persistent_workers: bool = True) -> Config:
    """Applies ``tools/train.py``'s flags to a loaded config.

    Args:
        cfg: The config (``--cfg-options`` already merged).
        config_path: The config file (its stem names the default work dir).
        work_dir: ``--work-dir``.
        resume: ``None`` (no resume), ``'auto'`` (latest checkpoint of the work dir) or a
            checkpoint path.
        amp: ``--amp`` (mixed precision through ``AmpOptimWrapper``).
        launcher: ``--launcher``.
        auto_scale_lr: ``--auto-scale-lr`` (mmpretrain's): ``auto_scale_lr.enable = True``.
        no_validate: ``--no-validate`` (mmpretrain's): no validation loop, loader or
            evaluator (and no best-checkpoint selection, which needs them).
        pin_memory: False for ``--no-pin-memory`` (mmpretrain's flag): no data loader pins
            memory.
        persistent_workers: False for ``--no-persistent-workers`` (mmpretrain's flag): no data
            loader keeps its workers between epochs.

    Returns:
        The same config, updated.

    Raises:
        ValueError: ``--auto-scale-lr`` on a config without ``auto_scale_lr.base_batch_size``.
    """
    world_of(cfg)
    _set_launcher_and_work_dir(cfg, config_path, work_dir, launcher)
    if auto_scale_lr:
        scale = cfg.get('auto_scale_lr', None)
        if not scale or 'base_batch_size' not in scale:
            raise ValueError('--auto-scale-lr needs auto_scale_lr = dict(base_batch_size=...) '
                             'in the config (the batch its lr was set for)')
        scale['enable'] = True
    if no_validate:
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
        checkpoint = (cfg.get('default_hooks', None) or {}).get('checkpoint', None)
        if checkpoint is not None and checkpoint.get('save_best', None):
            checkpoint['save_best'] = None
    if amp:
        given = cfg.optim_wrapper.get('type', 'OptimWrapper')
        wrapper = config_type_name(given)  # 'mmengine.OptimWrapper' builds the same class
        if wrapper == 'AmpOptimWrapper':
            print_log('AMP is already enabled in the config', logger='current',
                      level=logging.WARNING)
        elif wrapper != 'OptimWrapper':
            raise ValueError(f'--amp needs optim_wrapper.type="OptimWrapper", got {given!r}')
        else:
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    wrapper = cfg.get('optim_wrapper', None) or {}
    for key in ('dtype', 'loss_scale'):  # AmpOptimWrapper's options: OptimWrapper refuses them
        wrapper_type = config_type_name(wrapper.get('type', 'OptimWrapper'))
        if key in wrapper and wrapper_type == 'OptimWrapper':
            raise ValueError(f'optim_wrapper.{key}={wrapper[key]!r} is an option of mixed '
                             f'precision (AmpOptimWrapper); add --amp to train with it, or '
                             f'drop it to train in fp32')
    for key, keep in (('pin_memory', pin_memory), ('persistent_workers', persistent_workers)):
        if not keep:  # as mmpretrain's tools/train.py: every data loader of the config
            for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
                if cfg.get(loader, None) is not None:
                    cfg[loader][key] = False
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        cfg.resume = True
        cfg.load_from = resume
    adapt_to_device(cfg, launcher)
    return cfg


def _set_launcher_and_work_dir(cfg: Config, config_path: str, work_dir: Optional[str],
                               launcher: str) -> None:
    """``cfg.launcher``, and ``cfg.work_dir``: ``--work-dir``, else the config's own, else
    ``./work_dirs/<config stem>`` (mmseg's default)."""
    if launcher not in LAUNCHERS:
        raise KeyError(f'Unknown launcher {launcher!r}; available: {LAUNCHERS}')
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])


def prepare_test_config(cfg: Config,
                        config_path: str,
                        checkpoint: str,
                        work_dir: Optional[str] = None,
                        show_dir: Optional[str] = None,
                        show: bool = False,
                        wait_time: float = 2.0,
                        interval: int = 1,
                        out: Optional[str] = None,
                        launcher: str = 'none',
                        tta: bool = False,
                        out_item: Optional[str] = None,
                        pin_memory: bool = True,
                        amp: bool = False) -> Config:
    """Applies ``tools/test.py``'s flags to a loaded config.

    Adds ``mmlinvit.CheckpointCoverageHook`` (a checkpoint that misses weights of the model is
    refused instead of evaluating them at random) unless the config sets
    ``check_checkpoint_coverage = False``.

    The weights come from ``checkpoint``: the model's own checkpoint paths (``pretrained=``,
    ``Pretrained`` init_cfg, a distillation ``teacher_ckpt``; the keys of
    :func:`~mmlinvit.engine.preflight.clear_checkpoints`) are cleared, so a training-time
    input such as the Stage-2 ``student_backbone.pth`` need not exist to evaluate.  This
    changes no evaluated weight: ``Runner.test()`` never calls ``init_weights``, which is what
    reads ``pretrained=`` / init_cfg, and the only file read at build time, a distillation
    teacher's, feeds no prediction (``predict`` runs the student) and is not saved in
    checkpoints.  So with ``check_checkpoint_coverage = False`` a partial checkpoint leaves
    the same weights at their random init as before.

    Args:
        cfg: The config (``--cfg-options`` already merged).
        config_path: The config file (its stem names the default work dir).
        checkpoint: Weights to evaluate.
        work_dir: ``--work-dir``.
        show_dir: ``--show-dir``: where painted predictions are written.
        show: ``--show``: display predictions in a window.
        wait_time: Seconds each shown image stays.
        interval: Visualise every ``interval``-th sample.
        out: ``--out``: where raw predictions are dumped.
        launcher: ``--launcher``.
        tta: ``--tta``: test-time augmentation (see :func:`enable_tta`).
        out_item: ``--out-item`` (mmpretrain's flag, classification only): ``'pred'`` (or
            None) dumps the predictions to ``out``, ``'metrics'`` leaves them out (the tool
            dumps the metrics there after testing).
        pin_memory: False for ``--no-pin-memory``: the test data loader does not pin memory.
        amp: ``--amp`` (mmpretrain's flag): mixed-precision evaluation, mmengine's
            ``TestLoop(fp16=True)`` (autocast; fp16 on CUDA, bf16 on CPU).

    Raises:
        EvaluationFlagError: ``--out-item`` on a segmentation config or without ``--out``.

    Returns:
        The same config, updated.
    """
    world = world_of(cfg)
    if out_item is not None:
        if world.scope != 'mmpretrain':
            raise EvaluationFlagError(
                f'--out-item is mmpretrain\'s flag (classification configs); this is a '
                f'{world.task} config, whose --out DIR saves the raw predictions (drop '
                f'--out-item)')
        if out_item not in OUT_ITEMS:
            raise EvaluationFlagError(f'--out-item {out_item!r}: use one of {list(OUT_ITEMS)}')
        if out is None:
            raise EvaluationFlagError('--out-item needs --out FILE (where the predictions or '
                                      'the metrics are dumped)')
    if tta:
        enable_tta(cfg)
    _set_launcher_and_work_dir(cfg, config_path, work_dir, launcher)
    cfg.load_from = checkpoint
    cfg.resume = False
    cleared = clear_checkpoints(cfg.model)
    if cleared:
        print_log(f'Evaluating the weights of {checkpoint}; not reading the config\'s '
                  f'checkpoint paths {cleared}', logger='current', level=logging.INFO)
    if cfg.get('check_checkpoint_coverage', True):
        _add_custom_hook(cfg, 'mmlinvit.CheckpointCoverageHook', source=repr(checkpoint))
    if show or show_dir:
        world.enable_visualization(cfg, show_dir, show, wait_time, interval)
        if launcher != 'none':
            print_log(f'--show / --show-dir with --launcher {launcher}: mmseg\'s and '
                      f'mmpretrain\'s visualizers draw on rank 0 only, so only rank 0\'s share '
                      f'of the images (about 1 / number of processes) is painted. Run '
                      f'tools/test.py in one process to paint every image.',
                      logger='current', level=logging.WARNING)
    if out is not None and out_item in (None, 'pred'):
        world.enable_output_dump(cfg, out)
    if not pin_memory:
        cfg.test_dataloader['pin_memory'] = False
    if amp:
        test_loop = cfg.get('test_cfg', None)
        loop_type = config_type_name((test_loop or {}).get('type', 'TestLoop'))
        if loop_type != 'TestLoop':
            raise EvaluationFlagError(
                f"--amp sets fp16=True on mmengine's TestLoop; this config's test_cfg is a "
                f'{loop_type}: drop --amp, or add fp16 to that loop with --cfg-options')
        cfg.test_cfg = dict(test_loop or {}, fp16=True)  # as mmpretrain's tools/test.py
    adapt_to_device(cfg, launcher)
    return cfg


#: ``tools/test.py --out-item`` choices (mmpretrain's).
OUT_ITEMS = ('metrics', 'pred')


class EvaluationFlagError(ValueError):
    """A ``tools/test.py`` flag that does not fit the config (the message names the fix)."""


class TTAConfigError(EvaluationFlagError):
    """``--tta`` on a config without test-time augmentation settings."""


class ToolConfigError(EvaluationFlagError, KeyError):
    """A config the tools cannot run as it is (a ``default_scope`` without a world, ``--show``
    without a visualisation hook): an ``error:`` line of train.py / test.py.  Still a KeyError
    (what it was before) for callers that catch one."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0]) if self.args else ''


class LaunchError(RuntimeError):
    """A launcher that cannot start this process (e.g. ``--launcher slurm`` without GPUs)."""


def user_errors() -> Tuple[type, ...]:
    """Errors whose message names the problem and the fix: the tools print them as one
    ``error:`` line (exit status 1) instead of a traceback."""
    from mmlinvit.backbones.training_record import TrainingRecordMismatchError
    from mmlinvit.converters.loading import CheckpointMismatchError, UntrustedCheckpointError
    from mmlinvit.distill.errors import DistillationConfigError
    from .checkpoint_coverage import CheckpointCoverageError
    from .preflight import PreflightError
    from .resume import ResumeError
    return (PreflightError, ResumeError, CheckpointFileError, CheckpointMismatchError,
            TrainingRecordMismatchError, DistillationConfigError, CheckpointCoverageError,
            EvaluationFlagError, LaunchError, AmpDeviceError, UntrustedCheckpointError)


def enable_tta(cfg: Config) -> None:
    """Evaluates with the config's ``tta_pipeline`` through its ``tta_model``, as mmseg's
    ``tools/test.py --tta``, except that the wrapped model keeps its own data preprocessor.

    mmengine's runner gives a model config without ``data_preprocessor`` the top-level one,
    and ``BaseTTAModel`` writes its ``data_preprocessor`` into the model it wraps: the
    wrapper would replace the model's preprocessor by the top-level one (another padding in
    the Cityscapes Mask2Former configs; not the student's for a distillation model).  Here
    the model gets what it gets without TTA and the wrapper none.

    An mmpretrain config without them gets mmpretrain's ``tools/test.py`` defaults: scores
    averaged by ``AverageClsScoreTTA`` over the test pipeline with and without a horizontal
    flip.

    Args:
        cfg: The test config, changed in place.

    Raises:
        TTAConfigError: when an mmseg config has no ``tta_model`` / ``tta_pipeline``.
    """
    if cfg.get('default_scope', None) == 'mmpretrain':
        if not cfg.get('tta_model', None):
            cfg.tta_model = dict(type='mmpretrain.AverageClsScoreTTA')
        if not cfg.get('tta_pipeline', None):
            pipeline = copy.deepcopy(cfg.test_dataloader.dataset.pipeline)
            pipeline[-1] = dict(type='TestTimeAug', transforms=[
                [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
                [pipeline[-1]]])
            cfg.tta_pipeline = pipeline
    missing = [key for key in ('tta_model', 'tta_pipeline') if not cfg.get(key, None)]
    if missing:
        raise TTAConfigError(f'--tta needs {" and ".join(missing)} in the config (the mmlinvit '
                             f'segmentation bases define both: configs/_base_/datasets/*.py, '
                             f'configs/_base_/default_runtime_seg.py)')
    module = copy.deepcopy(cfg.model)
    top = cfg.get('data_preprocessor', None)
    if top is not None and 'data_preprocessor' not in module:
        module['data_preprocessor'] = top
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.model = dict(cfg.tta_model, module=module, data_preprocessor=None)
    print_log(f'--tta: evaluating {config_type_name(module.get("type"))} through '
              f'{config_type_name(cfg.tta_model.get("type"))} '
              f'with the tta_pipeline ({len(cfg.tta_pipeline)} transforms)', logger='current',
              level=logging.INFO)


def init_cpu_distributed(launcher: str) -> None:
    """Initialises a ``gloo`` process group for ``--launcher pytorch`` on CPU-only machines.

    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` first, which fails without a GPU;
    once a group exists, the runner skips its own initialisation.  The other launchers
    (``slurm``, ``mpi``) are refused on CPU-only machines, naming torchrun (mmengine failed
    with "Found no NVIDIA driver").

    Args:
        launcher: The ``--launcher`` value.
    """
    if launcher == 'none' or torch.cuda.is_available():
        return
    if launcher != 'pytorch':
        raise LaunchError(f'--launcher {launcher} initialises NCCL on GPUs (mmengine) and '
                           f'this machine has none; on CPU-only machines start the processes '
                           f'with torchrun and --launcher pytorch (bash tools/dist_train.sh '
                           f'CONFIG N, with NNODES / NODE_RANK / MASTER_ADDR / PORT for several '
                           f'nodes), which runs gloo')
    import torch.distributed as dist
    if dist.is_initialized():
        return
    required = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
    missing = [k for k in required if k not in os.environ]
    if missing:
        raise LaunchError(f'--launcher pytorch needs {missing} in the environment; start it '
                           f'with tools/dist_train.sh (torchrun)')
    dist.init_process_group(backend='gloo')


def _add_custom_hook(cfg: Config, hook_type: str, **kwargs: Any) -> None:
    hooks = list(cfg.get('custom_hooks', None) or [])
    # 'mmlinvit.X', 'X' or the class X itself (pure-Python configs)
    names = {config_type_name(h.get('type')) for h in hooks if isinstance(h, dict)}
    if hook_type.split('.', 1)[1] not in names:
        hooks.append(dict(type=hook_type, **kwargs))
    cfg.custom_hooks = hooks


def seed_samples_of_train_loader(cfg: Config) -> bool:
    """Puts the training data pipeline on per-sample random streams (exact ``--resume``).

    Wraps ``train_dataloader.dataset`` / ``.sampler`` in ``mmlinvit.SampleSeedDataset`` /
    ``mmlinvit.SampleSeedSampler`` (:mod:`mmlinvit.engine.sample_seeding`).  Loaders with a
    ``batch_sampler`` (whose batching reads indices) are left as they are, with a warning.

    Args:
        cfg: The config, changed in place.

    Returns:
        Whether the loader is (now) wrapped.
    """
    loader = cfg.get('train_dataloader', None)
    if not loader:
        return False
    dataset, sampler = loader.get('dataset'), loader.get('sampler')
    if isinstance(dataset, dict) and dataset.get('type') == 'mmlinvit.SampleSeedDataset':
        return True
    if loader.get('batch_sampler') or not isinstance(dataset, dict) or \
            not isinstance(sampler, dict):
        print_log('train_dataloader has a batch_sampler or a built dataset / sampler: its '
                  'random augmentation is not put on per-sample streams, so --resume will '
                  'not reproduce it exactly', logger='current', level=logging.WARNING)
        return False
    if (cfg.get('randomness', None) or {}).get('diff_rank_seed', False):
        # mmengine then builds the sampler with seed=None: a fresh shuffle seed every run
        print_log('randomness.diff_rank_seed=True: mmengine builds the train sampler without '
                  'the run seed, so the data order after --resume differs from the '
                  'interrupted run (set diff_rank_seed=False for an exact resume)',
                  logger='current', level=logging.WARNING)
    loader['dataset'] = dict(type='mmlinvit.SampleSeedDataset', dataset=dataset)
    loader['sampler'] = dict(type='mmlinvit.SampleSeedSampler', sampler=sampler)
    return True


def add_training_safeguards(cfg: Config) -> Config:
    """What ``tools/train.py`` adds to every training run.

    * ``mmlinvit.CheckFiniteHook``: stop at the first non-finite loss / gradient norm, never
      save non-finite weights;
    * ``mmlinvit.SyncNormStatsHook``: with several processes, plain BatchNorm statistics
      averaged over them before checkpoints and validation (no-op otherwise);
    * mmengine's default optimizer-wrapper constructor becomes
      ``mmlinvit.FrozenAwareOptimWrapperConstructor`` (same groups; frozen modules in one log
      line instead of one warning per parameter);
    * mmengine's ``CheckpointHook`` becomes ``mmlinvit.AtomicCheckpointHook`` (a checkpoint
      is written under a temporary name and renamed, old ones are rotated out only after it;
      a resume inside an epoch of an epoch-based loop is warned about);
    * ``mmlinvit.RandomStateHook``: with several processes each rank's own streams (dropout,
      drop-path, Mixup) are seeded from (seed, rank) unless ``rank_random_streams = False``;
      unless the config sets ``exact_resume = False`` it also saves the random states of every
      rank in checkpoints and restores them on ``--resume``;
    * unless ``exact_resume = False``: per-sample random streams for the data pipeline
      (:func:`seed_samples_of_train_loader`);
    * an early error for ``AmpOptimWrapper`` without a device that runs it, and gradient
      accumulation counted by ``auto_scale_lr`` (EMA momentum / checkpoint interval warned):
      :mod:`mmlinvit.engine.accumulation`.

    Args:
        cfg: The prepared config, changed in place.

    Returns:
        The same config.
    """
    check_amp_device(cfg)
    adapt_to_accumulation(cfg)
    _add_custom_hook(cfg, 'mmlinvit.CheckFiniteHook')
    _add_custom_hook(cfg, 'mmlinvit.SyncNormStatsHook')
    wrapper = cfg.get('optim_wrapper', None)
    default = 'DefaultOptimWrapperConstructor'
    if isinstance(wrapper, dict) and wrapper.get('constructor', default) in (
            default, f'mmengine.{default}'):
        wrapper['constructor'] = 'mmlinvit.FrozenAwareOptimWrapperConstructor'
    checkpoint = (cfg.get('default_hooks') or {}).get('checkpoint')
    if isinstance(checkpoint, dict) and checkpoint.get('type') in (
            'CheckpointHook', 'mmengine.CheckpointHook', CheckpointHook):
        checkpoint['type'] = 'mmlinvit.AtomicCheckpointHook'
    exact = bool(cfg.get('exact_resume', True))
    # per-rank process streams with any exact_resume; saving / restoring states only with it
    _add_custom_hook(cfg, 'mmlinvit.RandomStateHook',
                     rank_streams=bool(cfg.get('rank_random_streams', True)), save_states=exact)
    if exact:
        seed_samples_of_train_loader(cfg)
    return cfg


def build_runner(cfg: Config, mode: str = 'train', checkpoint: Optional[str] = None) -> Runner:
    """Checks every input path, then builds the runner (``RUNNERS`` when ``runner_type`` is set).

    For training, ``--resume`` is resolved here (the newest intact checkpoint of the work dir,
    or an error when there is none; :mod:`mmlinvit.engine.resume`), the checkpoint to load is
    checked, a resumed run without ``randomness.seed`` takes the interrupted run's seed
    (:func:`mmlinvit.engine.resume.resume_randomness`), and :func:`add_training_safeguards` is
    applied.  For testing, the checkpoint file is checked.  What these checks log (resume
    choices, config warnings) is also written to the run's log file, which the runner
    creates after them.

    Args:
        cfg: The prepared config.
        mode: ``'train'`` or ``'test'`` (which loaders / checkpoints are checked).
        checkpoint: The weights ``tools/test.py`` evaluates.

    Returns:
        The runner.
    """
    collector = _Collector()
    logger = MMLogger.get_current_instance()
    logger.addHandler(collector)
    try:
        runner = _checked_runner(cfg, mode, checkpoint)
    finally:
        logger.removeHandler(collector)
    # what the checks logged before the run's log file existed goes into it too
    for handler in runner.logger.handlers if runner.logger is not logger else []:
        if isinstance(handler, logging.FileHandler):
            for record in collector.records:
                if record.levelno >= handler.level:
                    handler.handle(record)
    return runner


class _Collector(logging.Handler):
    """Keeps the INFO+ records logged while :func:`build_runner` checks its inputs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _checked_runner(cfg: Config, mode: str, checkpoint: Optional[str]) -> Runner:
    """:func:`build_runner` without the log-file replay."""
    check_inputs(cfg, mode=mode, checkpoint=checkpoint)
    if mode == 'train':
        cfg.load_from = check_resume_or_load_from(bool(cfg.get('resume', False)),
                                                  cfg.get('load_from', None), cfg.work_dir)
        if cfg.get('resume', False) and cfg.load_from is not None:
            cfg.randomness = resume_randomness(cfg.get('randomness', None), cfg.load_from)
        elif cfg.load_from is not None and cfg.get('check_checkpoint_coverage', True):
            # strict=False: a file whose keys do not match would load nothing
            _add_custom_hook(cfg, 'mmlinvit.CheckpointCoverageHook',
                             source=repr(cfg.load_from), mode='train')
        add_training_safeguards(cfg)
        if cfg.get('resume', False) and cfg.load_from is not None:
            warn_changed_resume_config(cfg, cfg.load_from)
    elif checkpoint is not None:
        check_checkpoint_file(checkpoint)
    init_cpu_distributed(cfg.get('launcher', 'none'))
    _distinct_experiment_name(cfg)
    if 'runner_type' in cfg:
        from mmengine.registry import RUNNERS
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def _distinct_experiment_name(cfg: Config) -> None:
    """From the second Runner of a process on, gives the run a distinct experiment name.

    mmengine names a run ``<config stem>_<timestamp to the second>`` and keys its global
    DefaultScope, MMLogger and visualizer instances by that name.  A second Runner built from
    a config of the same file name within the same second (sweeps, tests, notebooks) was handed
    the first one's instances, e.g. the ``mmpretrain`` scope for an ``mmseg`` run ("SegLocal
    Visualizer is not in the mmpretrain::visualizer registry"), or the first run's log file.
    An ``experiment_name`` set in the config is kept.
    """
    global _runners_built
    _runners_built += 1
    if _runners_built > 1 and cfg.get('experiment_name') is None:
        stem = osp.splitext(osp.basename(cfg.filename))[0] if cfg.filename else 'run'
        cfg.experiment_name = f'{stem}-run{_runners_built}'


def finish_distributed() -> None:
    """Destroys the default process group after a successful run (no-op without one).

    A gloo process group left to the interpreter's exit is torn down while its C++ worker
    threads still hold work objects with Python references; the process then aborts
    ("terminate called without an active exception", SIGABRT) after a correct run.  PyTorch
    asks applications to call ``destroy_process_group`` at the end of ``main``.  Called on
    success only: after an error, other ranks may still be inside a collective.
    """
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
