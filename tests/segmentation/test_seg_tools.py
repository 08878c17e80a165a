"""tools/train.py, tools/test.py, tools/dist_train.sh: missing inputs stop the run before
training, an interrupted run resumes through --resume, and a 2-process gloo run completes."""
import copy
import glob
import importlib.util
import os
import os.path as osp
import re
import socket
import sys
import time

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from seg_helpers import REPO, tiny_config
from torchrun_retry import run_multiprocess

UPERNET = 'segmentation/upernet_deit-b-relu-fullcopy_8xb2-160k_ade20k-512x512.py'


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f'mmlinvit_tool_{name}',
                                                  osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SimulatedInterruption(RuntimeError):
    """Raised by :class:`InterruptAfterIterHook`."""


@HOOKS.register_module(force=True)
class InterruptAfterIterHook(Hook):
    """Stops training after iteration ``stop_after`` (its checkpoint is already saved)."""

    priority = 'LOWEST'

    def __init__(self, stop_after: int) -> None:
        self.stop_after = stop_after

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 >= self.stop_after:
            raise SimulatedInterruption(f'interrupted after iteration {runner.iter + 1}')


def _latest_log(work_dir: str) -> str:
    logs = sorted(glob.glob(osp.join(work_dir, '*', '*.log')), key=osp.getmtime)
    with open(logs[-1]) as f:
        return f.read()


def _next_second() -> None:
    """Waits for the clock's next second: mmengine names a run's log directory by its start
    time in seconds, and two runs started in the same second share one log file."""
    start = int(time.time())
    while int(time.time()) == start:
        time.sleep(0.05)


def test_missing_data_root_and_checkpoint_stop_before_training(tmp_path):
    train = _load_tool('train')
    work_dir = tmp_path / 'wd'
    missing_root = str(tmp_path / 'no_ade')
    with pytest.raises(SystemExit) as exc:
        train.main([
            osp.join(REPO, 'configs', 'adala_dinov2_ade20k.py'), '--work-dir',
            str(work_dir), '--cfg-options', f'train_dataloader.dataset.data_root={missing_root}'
        ])
    message = str(exc.value)
    assert missing_root in message
    assert 'ADEChallengeData2016.zip' in message  # how to get the data
    # The Stage-2 checkpoint and how to produce it.
    assert ('vit-adala-stage2-feat-align_dinov2-l-elu_8xb8-10e_in22k-512x512/'
            'student_backbone.pth') in message
    assert 'vit-adala-stage1' in message and 'vit-adala-stage2' in message  # how to make it
    assert not work_dir.exists()  # nothing was built


def test_unconverted_cityscapes_names_the_converter(tmp_path, city_root):
    # Raw gtFine without *_labelTrainIds.png (mmseg's converter not run yet).
    raw = tmp_path / 'cityscapes'
    for split in ('train', 'val'):
        (raw / 'leftImg8bit' / split / 'x').mkdir(parents=True)
        (raw / 'gtFine' / split / 'x').mkdir(parents=True)
        (raw / 'gtFine' / split / 'x' / 'x_000000_000019_gtFine_labelIds.png').write_bytes(b'')
    cfg = tiny_config('segmentation/mask2former_adala-dinov2-l-elu_8xb2-80k_cityscapes-512x1024.py',
                      str(raw), str(tmp_path / 'wd'))
    from mmlinvit.engine.preflight import MissingInputsError, check_inputs
    with pytest.raises(MissingInputsError, match='dataset_converters/cityscapes.py'):
        check_inputs(cfg)
    cfg.train_dataloader.dataset.data_root = city_root
    cfg.val_dataloader.dataset.data_root = city_root
    check_inputs(cfg)  # the converted layout passes


def test_test_tool_missing_checkpoint(tmp_path, ade_root):
    cfg = tiny_config(UPERNET, ade_root, str(tmp_path / 'wd'))
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    test = _load_tool('test')
    with pytest.raises(SystemExit, match='nope.pth'):
        test.main([cfg_file, str(tmp_path / 'nope.pth')])


def test_interrupted_run_resumes(tmp_path, ade_root):
    work_dir = str(tmp_path / 'wd')
    cfg = tiny_config(UPERNET, ade_root, work_dir)
    cfg.train_cfg.update(max_iters=3, val_begin=10)
    cfg.default_hooks.checkpoint.interval = 1
    cfg.log_level = 'INFO'
    cfg.custom_hooks = [dict(type='InterruptAfterIterHook', stop_after=2)]
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    train = _load_tool('train')

    with pytest.raises(SimulatedInterruption):
        train.main([cfg_file, '--work-dir', work_dir])
    assert osp.isfile(osp.join(work_dir, 'iter_2.pth'))
    assert not osp.isfile(osp.join(work_dir, 'iter_3.pth'))

    _next_second()
    train.main([cfg_file, '--work-dir', work_dir, '--resume', '--cfg-options', 'custom_hooks=[]'])
    log = _latest_log(work_dir)
    assert 'resumed' in log.lower()
    assert re.search(r'Iter\(train\) \[3/3\]', log)
    assert not re.search(r'Iter\(train\) \[1/3\]', log)  # iterations 1-2 were not redone
    ckpt = torch.load(osp.join(work_dir, 'iter_3.pth'), map_location='cpu', weights_only=False)
    assert ckpt['meta']['iter'] == 3

    # tools/test.py evaluates the result and paints the predictions.
    show_dir = str(tmp_path / 'painted')
    metrics = _load_tool('test').main([
        cfg_file, osp.join(work_dir, 'iter_3.pth'), '--work-dir', str(tmp_path / 'test_wd'),
        '--show-dir', show_dir, '--cfg-options', 'model.test_cfg.mode=slide'
    ])
    assert 0.0 <= metrics['mIoU'] <= 100.0
    painted = glob.glob(osp.join(show_dir, '**', '*.png'), recursive=True)
    assert len(painted) >= 2
    # --interval N paints every N-th test image (mmseg's hook painted all of them)
    every_other = str(tmp_path / 'every_other')
    _load_tool('test').main([
        cfg_file, osp.join(work_dir, 'iter_3.pth'), '--work-dir', str(tmp_path / 'test_wd2'),
        '--show-dir', every_other, '--interval', '2'])
    assert len(glob.glob(osp.join(every_other, '**', '*.png'), recursive=True)) == \
        (len(painted) + 1) // 2


def test_tools_choose_the_world_from_default_scope(tmp_path):
    from mmengine.config import Config

    from mmlinvit.engine.launch import prepare_test_config, world_of
    cls_cfg = Config.fromfile(osp.join(
        REPO, 'configs', 'copy_mlp_distill_attn',
        'copy-mlp-distill-attn_deit-t-elu_8xb64-300e_cifar10-224x224.py'))
    seg_cfg = Config.fromfile(osp.join(REPO, 'configs', 'adala_dinov2_ade20k.py'))
    assert world_of(cls_cfg).scope == 'mmpretrain' and world_of(seg_cfg).scope == 'mmseg'
    prepare_test_config(cls_cfg, 'x.py', 'ckpt.pth', show_dir=str(tmp_path))
    assert cls_cfg.default_hooks.visualization.enable
    assert cls_cfg.default_hooks.visualization.out_dir == str(tmp_path)
    prepare_test_config(seg_cfg, 'x.py', 'ckpt.pth', show_dir=str(tmp_path))
    assert seg_cfg.default_hooks.visualization.draw
    assert seg_cfg.visualizer.save_dir == str(tmp_path)
    seg_cfg.default_scope = 'mmdet'
    with pytest.raises(KeyError, match='mmpretrain'):
        world_of(seg_cfg)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def test_dist_train_and_test_two_processes_gloo(tmp_path, ade_root):
    work_dir = str(tmp_path / 'wd')
    cfg = tiny_config(UPERNET, ade_root, work_dir)
    cfg.train_cfg.update(max_iters=2, val_interval=2)
    cfg.default_hooks.checkpoint.interval = 2
    cfg.log_level = 'INFO'
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    env = dict(os.environ, PYTHON=sys.executable, PORT=str(_free_port()), OMP_NUM_THREADS='1',
               NNODES='1', NODE_RANK='0', MASTER_ADDR='127.0.0.1', CUDA_VISIBLE_DEVICES='')
    proc = run_multiprocess(
        ['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg_file, '2', '--work-dir', work_dir],
        env=env, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert osp.isfile(osp.join(work_dir, 'iter_2.pth'))
    log = _latest_log(work_dir)
    assert 'Distributed training: True' in log
    assert re.search(r'(GPU number|world_size)\W+2', log)
    assert 'mIoU' in log  # distributed validation gathered the results
    # the checks before the runner print once, not once per process
    checks = [line[line.index('Data check:'):] for line in proc.stdout.splitlines()
              if 'Data check:' in line]
    assert checks and len(checks) == len(set(checks)), checks

    env['PORT'] = str(_free_port())
    proc = run_multiprocess(
        ['bash', osp.join(REPO, 'tools', 'dist_test.sh'), cfg_file,
         osp.join(work_dir, 'iter_2.pth'), '2', '--work-dir', str(tmp_path / 'test_wd')],
        env=env, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'mIoU' in _latest_log(str(tmp_path / 'test_wd'))


def test_a_launched_process_without_launcher_is_refused(monkeypatch, capsys):
    """torchrun tools/train.py CONFIG (no --launcher pytorch): each of the processes would
    train alone on the same batches and write the same checkpoints, with exit status 0."""
    train, test = _load_tool('train'), _load_tool('test')
    monkeypatch.setenv('WORLD_SIZE', '2')
    for tool, argv in ((train, ['cfg.py']), (test, ['cfg.py', 'ckpt.pth'])):
        with pytest.raises(SystemExit):
            tool.parse_args(argv)
        assert '--launcher pytorch' in capsys.readouterr().err
    assert train.parse_args(['cfg.py', '--launcher', 'pytorch']).launcher == 'pytorch'
    monkeypatch.setenv('WORLD_SIZE', '1')
    assert train.parse_args(['cfg.py']).launcher == 'none'


@pytest.mark.parametrize('launcher,variable', [('slurm', 'SLURM_NTASKS'),
                                               ('mpi', 'OMPI_COMM_WORLD_SIZE')])
def test_slurm_and_mpi_tasks_know_the_number_of_processes_before_the_runner(
        monkeypatch, launcher, variable):
    """The checks before the runner (iterations per epoch against an iteration warm-up)
    read WORLD_SIZE, which mmengine sets only when it initialises the process group: under
    srun they counted one process (2500 iterations per epoch instead of 313 for 8 tasks) and
    the warning did not come."""
    from mmengine.config import Config

    from mmlinvit.engine.config_consistency import _epoch_loop_iterations
    train = _load_tool('train')
    # recorded, so that the WORLD_SIZE parse_args exports is removed after the test
    monkeypatch.setenv('WORLD_SIZE', '1')
    monkeypatch.delenv('WORLD_SIZE')
    monkeypatch.setenv(variable, '8')
    train.parse_args(['cfg.py'])  # --launcher none: one process, nothing exported
    assert 'WORLD_SIZE' not in os.environ
    monkeypatch.setenv('SLURM_PROCID', '0')
    train.parse_args(['cfg.py', '--launcher', launcher])
    assert os.environ['WORLD_SIZE'] == '8'
    cfg = Config(dict(train_cfg=dict(max_epochs=1), train_dataloader=dict(batch_size=32)))
    assert _epoch_loop_iterations(cfg, 80000) == 313
    # a stale exported WORLD_SIZE is replaced, as mmengine's init_dist replaces it
    monkeypatch.setenv('WORLD_SIZE', '2')
    train.parse_args(['cfg.py', '--launcher', launcher])
    assert os.environ['WORLD_SIZE'] == '8'


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU-only refusal')
def test_gpu_launchers_on_a_cpu_machine_name_torchrun():
    from mmlinvit.engine.launch import init_cpu_distributed
    for launcher in ('slurm', 'mpi'):
        with pytest.raises(RuntimeError, match='torchrun and --launcher pytorch'):
            init_cpu_distributed(launcher)
    init_cpu_distributed('none')  # single process: nothing to do


def test_amp_options_without_amp_are_refused_before_building():
    """optim_wrapper.dtype=bfloat16 (CheckFiniteHook's advice) without --amp: a bare TypeError
    from OptimWrapper once model and data were built."""
    from mmengine.config import Config

    from mmlinvit.engine.launch import prepare_train_config
    path = osp.join(REPO, 'configs', 'demo', 'upernet_vit-tiny-softmax_1xb8-300it_toy-64x64.py')
    cfg = Config.fromfile(path)
    cfg.optim_wrapper.dtype = 'bfloat16'
    with pytest.raises(ValueError, match=r'optim_wrapper.dtype=.bfloat16. .*add --amp'):
        prepare_train_config(cfg, path)
    cfg = Config.fromfile(path)
    cfg.optim_wrapper.dtype = 'bfloat16'
    prepare_train_config(cfg, path, amp=True)
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'


def test_train_flags_map_to_the_config(tmp_path):
    from mmengine.config import Config

    from mmlinvit.engine.launch import prepare_train_config
    path = osp.join(REPO, 'configs', 'adala_dinov2_ade20k.py')
    # mmpretrain's --auto-scale-lr / --no-validate
    cls_path = osp.join(REPO, 'configs', 'copy_mlp_distill_attn',
                        'copy-mlp-distill-attn_deit-b-elu_64xb64-300e_in1k-224x224.py')
    cfg = prepare_train_config(Config.fromfile(cls_path), cls_path, auto_scale_lr=True,
                               no_validate=True)
    assert cfg.auto_scale_lr.enable is True
    assert cfg.val_cfg is None and cfg.val_dataloader is None and cfg.val_evaluator is None
    assert not cfg.default_hooks.checkpoint.get('save_best')
    bare = Config.fromfile(path)
    bare.auto_scale_lr = None
    with pytest.raises(ValueError, match='base_batch_size'):  # no auto_scale_lr in the config
        prepare_train_config(bare, path, auto_scale_lr=True)
    args = _load_tool('train').parse_args(['cfg.py', '--auto-scale-lr', '--no-validate'])
    assert args.auto_scale_lr and args.no_validate
    cfg = prepare_train_config(Config.fromfile(path), path, amp=True, resume='auto')
    assert cfg.work_dir == osp.join('./work_dirs', 'adala_dinov2_ade20k')
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic'
    assert cfg.resume is True and cfg.load_from is None
    cfg = prepare_train_config(Config.fromfile(path), path, work_dir=str(tmp_path),
                               resume='ckpt.pth', launcher='pytorch')
    assert (cfg.work_dir, cfg.resume, cfg.load_from) == (str(tmp_path), True, 'ckpt.pth')
    if not torch.cuda.is_available():  # CPU: gloo, DDP without device_ids, no SyncBN
        assert cfg.env_cfg.dist_cfg.backend == 'gloo'
        assert cfg.model_wrapper_cfg.type == 'MMDistributedDataParallel'
        assert 'SyncBN' not in str(cfg.model)


def test_test_tool_refuses_a_checkpoint_that_misses_weights(tmp_path, ade_root):
    """A bare backbone file given as CHECKPOINT would be evaluated with a random decode head
    (mmengine loads load_from with strict=False): tools/test.py stops and says what it is."""
    from mmlinvit.engine.checkpoint_coverage import CheckpointCoverageError, uncovered_keys
    from mmlinvit.registry import MODELS
    cfg = tiny_config(UPERNET, ade_root, str(tmp_path / 'wd'))
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    backbone_cfg = dict(cfg.model.backbone, pretrained=None)
    backbone = MODELS.build(backbone_cfg).state_dict()
    bare = str(tmp_path / 'student_backbone.pth')
    torch.save(backbone, bare)
    test = _load_tool('test')
    with pytest.raises(SystemExit, match=r'(?s)student_backbone.pth.*decode_head \d+/\d+.*'
                                         r'bare backbone.*model.backbone.pretrained'):
        test.main([cfg_file, bare, '--work-dir', str(tmp_path / 't1')])
    # The same weights under a distillation run's student.* prefix are recognised too.
    distill = str(tmp_path / 'stage2.pth')
    torch.save(dict(state_dict={f'student.{k}': v for k, v in backbone.items()}), distill)
    with pytest.raises(SystemExit, match='bare-backbone student of a distillation run'):
        test.main([cfg_file, distill, '--work-dir', str(tmp_path / 't2')])
    # A complete checkpoint passes; optional keys (training records) may be missing.
    model = MODELS.build(dict(cfg.model.to_dict(), backbone=backbone_cfg))
    full = {k: v for k, v in model.state_dict().items() if not k.endswith('block_operators')}
    assert uncovered_keys(model, full) == []
    assert uncovered_keys(model, {f'module.{k}': v for k, v in full.items()}) == []
    assert uncovered_keys(model, backbone)[0].startswith('auxiliary_head.')
    from mmlinvit.engine.checkpoint_coverage import check_checkpoint_covers
    with pytest.raises(CheckpointCoverageError):
        check_checkpoint_covers(model, dict(state_dict=backbone), 'x')
    # Another shape (a checkpoint of another num_classes) would be skipped by strict=False.
    other = dict(full, **{'decode_head.conv_seg.weight': torch.zeros(3, 32, 1, 1)})
    with pytest.raises(CheckpointCoverageError,
                       match=r'another shape.*decode_head.conv_seg.weight: checkpoint \(3, 32'):
        check_checkpoint_covers(model, dict(state_dict=other), 'x')
    # A position grid of another size is resampled on load: fine.
    pos = full['backbone.pos_embed']
    grid = dict(full, **{'backbone.pos_embed': torch.zeros(1, 1 + 4, pos.shape[-1])})
    check_checkpoint_covers(model, dict(state_dict=grid), 'x')
    # Opting out evaluates anyway.
    metrics = test.main([cfg_file, bare, '--work-dir', str(tmp_path / 't3'), '--cfg-options',
                         'check_checkpoint_coverage=False'])
    assert 0.0 <= metrics['mIoU'] <= 100.0


#: The model's weights as ``runner.test()`` starts, recorded by
#: :class:`RecordEvaluatedWeightsHook` (filled by the last test run).
EVALUATED_WEIGHTS = {}


@HOOKS.register_module(force=True)
class RecordEvaluatedWeightsHook(Hook):
    """Copies the model's state dict into :data:`EVALUATED_WEIGHTS` before the test loop (the
    checkpoint is loaded by then): the weights tools/test.py really evaluates."""

    def before_test(self, runner) -> None:
        from mmengine.model import is_model_wrapper
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        EVALUATED_WEIGHTS.clear()
        EVALUATED_WEIGHTS.update({k: v.detach().clone() for k, v in model.state_dict().items()})


def _complete_weights(model_cfg: dict, scope: str, seed: int):
    """A state dict of every weight of ``model_cfg`` (its checkpoint paths cleared), offset
    from any initialisation so that evaluating it shows it was loaded."""
    from mmengine.registry import MODELS, DefaultScope

    from mmlinvit.engine.preflight import clear_checkpoints
    model_cfg = copy.deepcopy(model_cfg)
    clear_checkpoints(model_cfg)
    torch.manual_seed(seed)
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(model_cfg)
    return {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
            for k, v in model.state_dict().items()}


def _assert_evaluated(expected) -> None:
    assert EVALUATED_WEIGHTS, 'tools/test.py did not reach its test loop'
    assert set(expected) <= set(EVALUATED_WEIGHTS)
    for key, value in expected.items():
        assert torch.equal(EVALUATED_WEIGHTS[key], value), key


def test_test_tool_evaluates_a_complete_checkpoint_without_the_pretrained_files(
        tmp_path, ade_root):
    """CHECKPOINT carries every weight: the config's ``pretrained=`` (a training input such as
    the Stage-2 student_backbone.pth) is not needed to evaluate it, as in tools/infer.py; a
    checkpoint that misses weights is still refused."""
    cfg = tiny_config(UPERNET, ade_root, str(tmp_path / 'wd'))
    full = _complete_weights(cfg.model.to_dict(), cfg.default_scope, seed=11)
    missing = str(tmp_path / 'stage2' / 'student_backbone.pth')
    cfg.model.backbone.pretrained = missing
    cfg.custom_hooks = [dict(type='RecordEvaluatedWeightsHook')]
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    ckpt = str(tmp_path / 'iter_1.pth')
    torch.save(dict(meta=dict(iter=1), state_dict=full), ckpt)
    test = _load_tool('test')
    EVALUATED_WEIGHTS.clear()
    metrics = test.main([cfg_file, ckpt, '--work-dir', str(tmp_path / 't1')])
    assert 0.0 <= metrics['mIoU'] <= 100.0
    _assert_evaluated(full)  # exactly the checkpoint's weights were evaluated
    assert not osp.exists(missing)
    # The coverage check still guards: without the decode head the checkpoint is refused.
    partial = str(tmp_path / 'partial.pth')
    torch.save(dict(state_dict={k: v for k, v in full.items()
                                if not k.startswith('decode_head.')}), partial)
    with pytest.raises(SystemExit, match=r'partial\.pth.* does not hold .*decode_head \d+/\d+'):
        test.main([cfg_file, partial, '--work-dir', str(tmp_path / 't2')])


def test_test_tool_evaluates_a_distillation_student_without_teacher_files(tmp_path, ade_root):
    """A distillation config (teacher ``pretrained=`` and ``teacher_ckpt``, student
    ``pretrained=``, none of them present) evaluates its checkpoint's student."""
    cfg = tiny_config('segmentation/upernet_deit-b-relu-fullcopy-distill_8xb2-160k_ade20k-'
                      '512x512.py', ade_root, str(tmp_path / 'wd'))
    assert cfg.model.type == 'mmlinvit.DistillationModel'
    student = _complete_weights(cfg.model.student.to_dict(), cfg.default_scope, seed=12)
    gone = tmp_path / 'gone'
    cfg.model.student.backbone.pretrained = str(gone / 'deit-b.pth')
    cfg.model.teacher.pretrained = str(gone / 'teacher.pth')
    cfg.model.teacher_ckpt = str(gone / 'teacher_ckpt.pth')
    from mmlinvit.engine.preflight import clear_checkpoints
    assert sorted(clear_checkpoints(copy.deepcopy(cfg.model.to_dict()))) == [
        'model.student.backbone.pretrained', 'model.teacher.pretrained', 'model.teacher_ckpt']
    cfg.custom_hooks = [dict(type='RecordEvaluatedWeightsHook')]
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    ckpt = str(tmp_path / 'iter_1.pth')
    torch.save(dict(meta=dict(iter=1), state_dict={f'student.{k}': v
                                                   for k, v in student.items()}), ckpt)
    EVALUATED_WEIGHTS.clear()
    metrics = _load_tool('test').main([cfg_file, ckpt, '--work-dir', str(tmp_path / 't')])
    assert 0.0 <= metrics['mIoU'] <= 100.0
    _assert_evaluated({f'student.{k}': v for k, v in student.items()})
    assert not gone.exists()


def test_a_loopback_master_addr_in_a_multi_node_slurm_job_is_refused(monkeypatch, capsys):
    """mmengine keeps an exported MASTER_ADDR under Slurm: localhost on a 2-node job made the
    second node wait for a rendezvous on itself (a silent hang)."""
    train = _load_tool('train')
    monkeypatch.setenv('WORLD_SIZE', '1')  # recorded: parse_args exports it
    monkeypatch.setenv('SLURM_NTASKS', '16')
    monkeypatch.setenv('SLURM_PROCID', '0')
    monkeypatch.setenv('SLURM_NNODES', '2')
    monkeypatch.setenv('MASTER_ADDR', 'localhost')
    with pytest.raises(SystemExit):
        train.parse_args(['cfg.py', '--launcher', 'slurm'])
    assert 'unset MASTER_ADDR' in capsys.readouterr().err
    for nodes, address in [('1', 'localhost'), ('2', 'gpu-node-017')]:
        monkeypatch.setenv('SLURM_NNODES', nodes)
        monkeypatch.setenv('MASTER_ADDR', address)
        assert train.parse_args(['cfg.py', '--launcher', 'slurm']).launcher == 'slurm'
    monkeypatch.setenv('SLURM_NNODES', '2')
    monkeypatch.delenv('MASTER_ADDR')  # mmengine takes the job's first node
    assert train.parse_args(['cfg.py', '--launcher', 'slurm']).launcher == 'slurm'
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')  # other launchers: not Slurm's business
    assert train.parse_args(['cfg.py', '--launcher', 'pytorch']).launcher == 'pytorch'


#: Autocast dtypes seen inside the test loop's forward by :class:`RecordAutocastHook`.
AUTOCAST_SEEN = []


@HOOKS.register_module(force=True)
class RecordAutocastHook(Hook):
    """Records whether each test iteration runs under CPU autocast (mmengine's TestLoop wraps
    the forward in it when ``fp16=True``) and the loop's flag."""

    def before_test(self, runner) -> None:
        AUTOCAST_SEEN.clear()
        AUTOCAST_SEEN.append(('fp16', runner.test_loop.fp16))

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        AUTOCAST_SEEN.append(('logits', outputs[0].seg_logits.data.dtype))


def test_test_tool_amp_evaluates_under_autocast(tmp_path, ade_root):
    """``tools/test.py --amp`` (mmpretrain's flag) evaluates through mmengine's
    ``TestLoop(fp16=True)``: the forward runs under autocast (bf16 logits on CPU) and the
    metric is computed; without it the loop and the logits are fp32."""
    cfg = tiny_config(UPERNET, ade_root, str(tmp_path / 'wd'))
    full = _complete_weights(cfg.model.to_dict(), cfg.default_scope, seed=5)
    cfg.custom_hooks = [dict(type='RecordAutocastHook')]
    cfg_file = str(tmp_path / 'cfg.py')
    cfg.dump(cfg_file)
    ckpt = str(tmp_path / 'iter_1.pth')
    torch.save(dict(meta=dict(iter=1), state_dict=full), ckpt)
    test = _load_tool('test')
    metrics = test.main([cfg_file, ckpt, '--work-dir', str(tmp_path / 't1'), '--amp'])
    assert 0.0 <= metrics['mIoU'] <= 100.0
    assert AUTOCAST_SEEN[0] == ('fp16', True)
    assert {dtype for kind, dtype in AUTOCAST_SEEN[1:]} == {torch.bfloat16}
    _next_second()
    test.main([cfg_file, ckpt, '--work-dir', str(tmp_path / 't2')])
    assert AUTOCAST_SEEN[0] == ('fp16', False)
    assert {dtype for kind, dtype in AUTOCAST_SEEN[1:]} == {torch.float32}
