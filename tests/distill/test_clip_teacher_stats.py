"""A CLIP teacher swapped into a distillation config without ``teacher_input_norm`` saw the
data preprocessor's ImageNet-normalised images without a word (only the reverse swap, CLIP
statistics for a non-CLIP teacher, was warned).  Now it is warned at build time, naming the
``model.teacher_input_norm`` with OpenAI CLIP's statistics (openai/CLIP ``clip/clip.py``
``_transform``, written out here).

The model is the shipped Copy-MLP config built as the Runner builds it, widths divided by 8
(``tests/configs/config_testing.py``), with ``--cfg-options model.teacher.family=clip``.
"""
import os.path as osp
import sys
from typing import Callable

from mmengine.registry import MODELS, init_default_scope

sys.path.insert(0, osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'configs'))
from config_testing import model_config, shrink_width  # noqa: E402

COPY_MLP = 'copy_mlp_distill_attn/copy-mlp-distill-attn_deit-b-elu_64xb64-300e_in1k-224x224.py'
#: OpenAI CLIP's Normalize statistics for 0-1 pixels, times 255 (the preprocessor's units).
CLIP_MEAN = [0.48145466 * 255, 0.4578275 * 255, 0.40821073 * 255]
CLIP_STD = [0.26862954 * 255, 0.26130258 * 255, 0.27577711 * 255]


def build(edit: Callable[[dict], None]):
    cfg, model = model_config(COPY_MLP)
    init_default_scope(cfg.default_scope)
    edit(model)
    shrink_width(model)
    model['check_input_size'] = (32, 32)
    for side in (model['student']['backbone'], model['teacher']):
        side['img_size'] = 32
    return MODELS.build(model)



def stats_warnings(messages):
    return [m for m in messages if 'CLIP' in m and 'teacher_input_norm' in m]


def clip_teacher(model: dict) -> None:
    """--cfg-options model.teacher.family=clip"""
    model['teacher']['family'] = 'clip'


def test_clip_teacher_under_imagenet_statistics_warns(warnings_logged):
    model = build(clip_teacher)
    assert model.teacher.family == 'clip' and model.teacher_input_norm is None
    found = stats_warnings(warnings_logged)
    assert len(found) == 1, warnings_logged
    message = found[0]
    assert "family='clip'" in message and 'model.teacher_input_norm' in message
    assert '0.48145466' in message and '0.26862954' in message  # OpenAI CLIP's mean / std
    assert '123.675' in message  # the statistics the teacher would see instead


def test_the_named_fix_silences_it(warnings_logged):
    def fixed(model: dict) -> None:
        clip_teacher(model)
        model['teacher_input_norm'] = dict(mean=CLIP_MEAN, std=CLIP_STD)

    model = build(fixed)
    assert model.teacher_input_norm is not None
    assert not stats_warnings(warnings_logged), warnings_logged


def test_other_statistics_given_to_a_clip_teacher_warn_too(warnings_logged):
    def imagenet(model: dict) -> None:
        clip_teacher(model)
        model['teacher_input_norm'] = dict(mean=[127.5] * 3, std=[127.5] * 3)

    build(imagenet)
    assert len(stats_warnings(warnings_logged)) == 1, warnings_logged


def test_the_shipped_deit_teacher_does_not_warn(warnings_logged):
    build(lambda model: None)
    assert not stats_warnings(warnings_logged), warnings_logged
