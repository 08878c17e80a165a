"""The model index (model-index.yml + configs/**/metafile.yml + README table) is in sync with
the configs, in OpenMMLab's format, readable by mmengine, and its numbers are counted."""
import importlib.util
import inspect
import os
import os.path as osp

import pytest
import yaml

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f'mmlinvit_tool_{name}',
                                                  osp.join(REPO, 'tools', 'analysis', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def tool():
    return _load_tool('model_index')


def test_every_config_is_listed_and_metadata_match_the_configs(tool):
    """Fails when a config is added, removed or changed without regenerating the index."""
    problems = tool.check()
    assert not problems, 'run python tools/analysis/model_index.py:\n' + '\n'.join(problems)


def test_index_is_openmmlab_format(tool):
    with open(osp.join(REPO, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    names, collections, models = set(), set(), []
    for meta_path in index['Import']:
        assert osp.isfile(osp.join(REPO, meta_path)), meta_path
        with open(osp.join(REPO, meta_path)) as f:
            metafile = yaml.safe_load(f)
        assert set(metafile) == {'Collections', 'Models'}
        collections |= {c['Name'] for c in metafile['Collections']}
        models += metafile['Models']
    for model in models:
        assert model['Name'] not in names
        names.add(model['Name'])
        assert osp.isfile(osp.join(REPO, model['Config'])), model['Config']
        assert model['In Collection'] in collections
        meta = model['Metadata']
        assert isinstance(meta['Parameters'], int) and meta['Parameters'] > 0
        assert isinstance(meta['FLOPs'], int) and meta['FLOPs'] > 0
        assert 'Results' in model
        for ckpt in meta['Checkpoints']:
            assert set(ckpt) <= {'Path', 'Key', 'How to get'}


def test_readme_table_is_the_generated_one(tool):
    entries = sorted(tool.read_index().values(), key=lambda e: e['Config'])
    with open(osp.join(REPO, 'README.md')) as f:
        readme = f.read()
    block = readme.split(tool.TABLE_START, 1)[1].split(tool.TABLE_END, 1)[0].strip()
    assert block == tool.table(entries)


def test_demo_numbers_are_counted(tool):
    """The tiny demo configs are recounted (milliseconds) and must equal the metafile."""
    entries = tool.read_index()
    demo = [c for c in entries if c.startswith('configs/demo/')]
    assert demo
    for config in demo:
        params, flops, _ = tool.count(config, tool.load(osp.join(REPO, config)))
        meta = entries[config]['Metadata']
        assert (meta['Parameters'], meta['FLOPs']) == (params, flops), config


def test_mmengine_hub_reads_the_index_through_the_mmlinvit_scope():
    """mmengine's own metafile lookup (hub.get_config) finds the entry in mmlinvit/.mim."""
    from mmengine.hub import get_config

    import mmlinvit.registry  # noqa: F401  (registers the scopes)
    cfg = get_config('mmlinvit::demo/upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py')
    assert cfg.model.backbone.type == 'mmlinvit.LinearVisionTransformer'
    assert os.path.realpath(cfg.filename) == osp.join(
        REPO, 'configs', 'demo', 'upernet_vit-tiny-elu_1xb8-200it_toy-64x64.py')


ADVENTURER_CONFIG = 'configs/linearizer/linear-head_adventurer-b_16xb64-30e_in1k-224x224.py'


def _adventurer_b_flops(height: int, width: int, chunk: int, num_classes: int) -> int:
    """Adventurer-B/16 + linear head written out (2 x MACs, batch 1): patch conv; per layer
    the Mamba-2 mixer over the tokens + the appended class token (in_proj, SSD scan at
    ``chunk`` on tokens padded to whole chunks, out_proj; its depthwise conv1d counts zero, as
    the convention says) and the SwiGLU MLP over the tokens; the head on the class token."""
    patch, dim, depth, mlp_hidden, headdim, d_state, groups = 16, 768, 12, 1920, 64, 64, 1
    patches = -(-height // patch) * -(-width // patch)
    tokens = patches + 1  # class token
    mixed = tokens + 1  # the mixer also reads the class token appended at the end
    d_inner = 2 * dim
    heads = d_inner // headdim
    conv_dim = d_inner + 2 * groups * d_state
    padded = -(-mixed // chunk) * chunk
    mixer = 2 * mixed * dim * (d_inner + conv_dim + heads) + 2 * mixed * d_inner * dim
    scan = (2 * groups * padded * chunk * d_state + 2 * heads * padded * chunk * headdim +
            4 * heads * padded * d_state * headdim)
    mlp = 3 * 2 * tokens * dim * mlp_hidden
    return 2 * patches * 3 * patch * patch * dim + depth * (mixer + scan + mlp) + \
        2 * dim * num_classes


def test_adventurer_numbers_are_counted_at_the_configured_chunk(tool):
    """An Adventurer entry recounted on meta tensors equals its metafile entry and the closed
    form at the configured chunk (256), not at the CPU inference form's 64-token chunks."""
    entries = tool.read_index()
    cfg = tool.load(osp.join(REPO, ADVENTURER_CONFIG))
    from mmlinvit.layers.mamba2 import Mamba2Mixer
    assert 'chunk_size' not in (cfg.model.backbone.get('mixer_cfg') or {})
    assert inspect.signature(Mamba2Mixer).parameters['chunk_size'].default == 256
    params, flops, device = tool.count(ADVENTURER_CONFIG, cfg)
    assert device == 'meta'
    meta = entries[ADVENTURER_CONFIG]['Metadata']
    assert (meta['Parameters'], meta['FLOPs']) == (params, flops)
    assert flops == _adventurer_b_flops(224, 224, 256, 1000)


def test_every_checkpoint_says_how_to_get_it(tool):
    """The AdaLA and Copy-MLP teachers (DINOv2-L, DeiT-B / T) had no 'How to get' and the
    pre-flight stop printed a generic sentence without the download address."""
    import glob

    import yaml
    missing = []
    for path in glob.glob(osp.join(REPO, 'configs', '*', 'metafile.yml')):
        with open(path) as f:
            for model in yaml.safe_load(f)['Models']:
                for ckpt in model['Metadata'].get('Checkpoints') or []:
                    hint = ckpt.get('How to get', '')
                    if not hint or (not ckpt['Path'].startswith('work_dirs/')
                                    and 'https://' not in hint):
                        missing.append((model['Name'], ckpt['Key']))
    assert not missing, missing


def test_student_label_says_when_the_student_starts_from_random_weights(tool):
    """A ViT student without weights (the Linearizer ViT-B, the demo's softmax model) was
    labelled 'DeiT ViT-B/16', as if it started from DeiT's weights; ``family`` only names its
    layout.  Students that read weights (``pretrained=``, a Pretrained ``init_cfg``,
    ``load_from``, a weight transfer from the teacher) keep the family label."""
    from mmengine.config import Config
    backbone = dict(type='mmlinvit.LinearVisionTransformer', arch='b', family='deit')
    random_label = 'ViT-B/16 (DeiT layout, random init)'

    def student_label(model: dict, **cfg) -> str:
        return tool.describe('configs/x.py', Config(dict(
            model=model, default_scope='mmpretrain', crop_size=224, **cfg)))['Student']

    def distill(student: dict, **extra) -> dict:
        return dict(type='mmlinvit.DistillationModel', student=student,
                    teacher=dict(type='mmlinvit.VisionTransformer', arch='b', family='clip',
                                 pretrained='t.pth'), **extra)

    assert student_label(distill(dict(backbone))) == random_label
    assert student_label(distill(dict(backbone), weight_transfer=dict(type='random'))) == \
        random_label
    assert student_label(distill(dict(backbone), weight_transfer=dict(type='mlp_copy'))) == \
        'DeiT ViT-B/16'
    assert student_label(distill(dict(backbone, pretrained='s.pth'))) == 'DeiT ViT-B/16'
    init = dict(type='Pretrained', checkpoint='s.pth')
    classifier = dict(type='ImageClassifier', backbone=dict(backbone, init_cfg=init))
    assert student_label(classifier) == 'DeiT ViT-B/16'
    classifier = dict(type='ImageClassifier', backbone=dict(backbone))
    assert student_label(classifier) == random_label
    assert student_label(classifier, load_from='run/epoch_3.pth') == 'DeiT ViT-B/16'
    with_head_weights = dict(classifier, head=dict(type='LinearClsHead', init_cfg=init))
    assert student_label(with_head_weights) == random_label  # a head's weights only
    assert student_label(dict(classifier, pretrained='whole.pth')) == 'DeiT ViT-B/16'
    adventurer = dict(type='mmlinvit.Adventurer', arch='b')
    assert student_label(distill(adventurer)) == 'Adventurer-B/16 (random init)'
    assert student_label(distill(dict(adventurer, pretrained='a.pth'))) == 'Adventurer-B/16'
