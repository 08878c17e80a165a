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
