"""``export_student.py --whole-student``: the distilled classifier (backbone and its trained
head) as the checkpoint of a plain student config, evaluated by ``tools/test.py`` without the
teacher.  Before, only the backbone could be exported (the head, trained for the whole recipe,
was dropped) and a plain classifier config refused the runner checkpoint (``student.*``)."""
import copy
import os.path as osp
import pickle

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from mmlinvit.utils.cli import load_script
from distill_testing import CONFIGS, save_tiny_vit_checkpoint, shrink_config, write_image_folder

REPO = osp.dirname(CONFIGS)
RECIPE = 'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-b-elu_64xb64-300e_in1k-224x224.py'


def _scores(path):
    with open(path, 'rb') as f:
        return torch.stack([torch.as_tensor(item['pred_score']) for item in pickle.load(f)])


@pytest.mark.usefixtures('one_thread')
def test_whole_student_export_evaluates_like_the_distillation_run(tmp_path):
    data = write_image_folder(str(tmp_path / 'data'), num_per_class=2)
    teacher = save_tiny_vit_checkpoint(str(tmp_path / 'deit.pth'), family='deit', seed=1)
    cfg = Config.fromfile(osp.join(CONFIGS, RECIPE))
    shrink_config(cfg, data, str(tmp_path / 'distill'), teacher_ckpt=teacher)
    cfg.optim_wrapper.optimizer.lr = 1e-2  # the head and backbone move away from their init
    Runner.from_cfg(copy.deepcopy(cfg)).train()
    ckpt = str(tmp_path / 'distill' / 'epoch_1.pth')

    export = load_script(osp.join(REPO, 'tools', 'model_converters', 'export_student.py'),
                         'export_student_tool')
    out = str(tmp_path / 'student.pth')
    assert export.main([ckpt, out, '--whole-student']) == 0
    state = torch.load(out, weights_only=True)
    trained = torch.load(ckpt, map_location='cpu', weights_only=False)['state_dict']
    assert {'head.fc.weight', 'head.fc.bias'} <= set(state)
    assert set(state) == {k[len('student.'):] for k in trained if k.startswith('student.')}

    test = load_script(osp.join(REPO, 'tools', 'test.py'), 'test_tool')
    distill_scores = str(tmp_path / 'distill.pkl')
    test.main([osp.join(tmp_path, 'distill', osp.basename(RECIPE)), ckpt,
               '--work-dir', str(tmp_path / 'test_distill'), '--out', distill_scores])

    plain = copy.deepcopy(cfg)
    plain.model = copy.deepcopy(cfg.model.student)
    plain.model.data_preprocessor = copy.deepcopy(cfg.model.get('data_preprocessor', None)
                                                  or cfg.data_preprocessor)
    plain.model.backbone.pretrained = None
    plain.work_dir = str(tmp_path / 'plain')
    plain_path = str(tmp_path / 'plain.py')
    plain.dump(plain_path)
    student_scores = str(tmp_path / 'student.pkl')
    test.main([plain_path, out, '--work-dir', str(tmp_path / 'test_plain'),
               '--out', student_scores])
    torch.testing.assert_close(_scores(student_scores), _scores(distill_scores), rtol=0, atol=0)
