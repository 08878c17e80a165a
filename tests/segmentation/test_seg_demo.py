"""The embedded demo runs end to end in its shortened form and leaves its artefacts."""
import importlib.util
import json
import os.path as osp

from seg_helpers import REPO


def test_demo_quick(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location('mmlinvit_demo',
                                                  osp.join(REPO, 'tools', 'demo.py'))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    work_dir = tmp_path / 'demo'
    summary = demo.main(['--quick', '--work-dir', str(work_dir)])

    for key in ('teacher_mIoU', 'student_mIoU'):
        assert 0.0 <= summary[key] <= 100.0
    assert osp.isfile(summary['predictions_png'])
    from PIL import Image
    with Image.open(summary['predictions_png']) as im:  # titled columns
        assert im.text['Description'] == 'image | ground truth | teacher (softmax) | ' \
            'student (ELU+1 linear)'
    for key in ('real_photos_png', 'loss_curves_png'):
        with open(summary[key], 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n', key
    assert 0.0 <= summary['photo_attention_tv'] <= 1.0
    assert 0.0 <= summary['photo_feature_cosine_gap'] <= 2.0
    for key in ('teacher_checkpoint', 'stage2_checkpoint', 'student_checkpoint'):
        assert osp.isfile(summary[key]) and summary[key].startswith(str(work_dir))
    with open(work_dir / 'summary.json') as f:
        assert json.load(f)['student_mIoU'] == summary['student_mIoU']
    assert (work_dir / 'data' / 'toy_ade' / 'ADEChallengeData2016' / 'images' /
            'training').is_dir()
    for stage in ('teacher', 'stage1', 'stage2', 'student'):
        assert list((work_dir / stage).glob('*/*.log')), stage
    out = capsys.readouterr().out
    assert 'teacher IoU' in out and 'student IoU' in out and 'wall time' in out
    assert 'real photos' in out and 'loss curves' in out


def test_demo_scores_leave_ignored_pixels_out():
    """mmseg's IoUMetric: pixels labelled 255 are in no class's intersection or union."""
    from types import SimpleNamespace

    import torch

    from mmlinvit.utils.cli import load_script
    demo = load_script(osp.join(REPO, 'tools', 'demo.py'), 'mmlinvit_demo_scores')

    class _Model(torch.nn.Module):

        def test_step(self, batch):
            prediction = SimpleNamespace(data=torch.tensor([[[0, 1, 0, 1]]]))
            ground_truth = SimpleNamespace(data=torch.tensor([[[0, 1, 255, 255]]]))
            return [SimpleNamespace(pred_sem_seg=prediction, gt_sem_seg=ground_truth,
                                    img_path='x.png')]

    runner = SimpleNamespace(model=_Model(), test_dataloader=[None])
    inter, union, _ = demo.predict_and_score(runner, num_classes=2, keep=0)
    assert inter.tolist() == [1, 1] and union.tolist() == [1, 1], (inter, union)
