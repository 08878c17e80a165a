"""The official OpenAI CLIP release files are TorchScript archives, not ``torch.save`` files.

``clip.load`` reads ``ViT-B-16.pt`` with ``torch.jit.load`` ("loading JIT archive"), and
``torch.load(weights_only=True)`` refuses such an archive with a bare ``RuntimeError``.  Here a
TorchScript archive is written the way the releases hold their weights: a scripted module
whose ``state_dict`` is the official CLIP state dict of
``tests/fixtures/clip_official_reference.pt`` (released dotted names, text tower, ``input_resolution`` ...; see
``tests/backbones/test_clip_official.py``).  Without trust the file is refused naming it a
TorchScript archive and the conversion command; ``convert_checkpoint.py --trust-checkpoint``
turns it into a file that ``VisionTransformer(family='clip', pretrained=...)`` loads, and the
model then reproduces the official CLIP image tower's outputs (the golden file's).
"""
import importlib.util
import os.path as osp
import warnings
from types import ModuleType
from typing import Mapping

import pytest
import torch
import torch.nn as nn

from mmlinvit.backbones import VisionTransformer
from mmlinvit.converters import UntrustedCheckpointError, load_checkpoint_file, load_pretrained
from official_golden import load_generator, load_golden

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOL = 1e-5
GEN = load_generator('make_clip_reference')


@pytest.fixture(scope='module')
def golden() -> dict:
    return load_golden('clip_official_reference.pt')


def module_holding(state_dict: Mapping[str, torch.Tensor]) -> nn.Module:
    """Nested modules whose ``state_dict`` is ``state_dict`` (same dotted names, same tensors)."""
    root = nn.Module()
    for key, value in state_dict.items():
        *path, leaf = key.split('.')
        module = root
        for name in path:
            if not hasattr(module, name):
                module.add_module(name, nn.Module())
            module = getattr(module, name)
        if value.is_floating_point():
            module.register_parameter(leaf, nn.Parameter(value.clone(), requires_grad=False))
        else:
            module.register_buffer(leaf, value.clone())
    return root


@pytest.fixture(scope='module')
def torchscript_release(golden, tmp_path_factory) -> str:
    """The official CLIP weights as a TorchScript archive, like the released ``ViT-B-16.pt``."""
    path = str(tmp_path_factory.mktemp('clip_jit') / 'ViT-tiny-16.pt')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)  # torch.jit is deprecated in torch 2.x
        torch.jit.save(torch.jit.script(module_holding(golden['state_dict'])), path)
        archived = torch.jit.load(path, map_location='cpu').state_dict()
    # The archive is what the fixture claims: the official state dict, bit for bit.
    assert set(archived) == set(golden['state_dict'])
    assert all(torch.equal(archived[k], v) for k, v in golden['state_dict'].items())
    return path


def converter_cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        'mmlinvit_tool_convert_checkpoint',
        osp.join(REPO, 'tools', 'model_converters', 'convert_checkpoint.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_untrusted_torchscript_archive_is_refused_with_the_conversion_command(
        torchscript_release):
    with pytest.raises(UntrustedCheckpointError) as info:
        load_checkpoint_file(torchscript_release)
    message = str(info.value)
    assert 'TorchScript' in message and 'OpenAI CLIP' in message
    assert '--trust-checkpoint' in message
    assert ('tools/model_converters/convert_checkpoint.py ' + torchscript_release) in message
    # The backbone's pretrained= path (the Linearizer teacher) reaches the same error.
    model = VisionTransformer(family='clip', pretrained=torchscript_release,
                              **GEN.mmlinvit_kwargs())
    with pytest.raises(UntrustedCheckpointError, match='TorchScript'):
        model.init_weights()


def test_trusted_torchscript_archive_reads_its_state_dict(golden, torchscript_release):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)
        state_dict = load_checkpoint_file(torchscript_release, trust_checkpoint=True)
    assert set(state_dict) == set(golden['state_dict'])
    assert all(torch.equal(state_dict[k], v) for k, v in golden['state_dict'].items())


def test_converted_release_reproduces_the_official_image_tower(golden, torchscript_release,
                                                               tmp_path, capsys):
    cli = converter_cli()
    out = str(tmp_path / 'checkpoints' / 'clip_vit_b16_openai.pt')
    assert cli.main([torchscript_release, out]) == 1
    assert 'TorchScript' in capsys.readouterr().err and not osp.exists(out)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)
        assert cli.main([torchscript_release, out, '--trust-checkpoint']) == 0
    assert torch.load(out, weights_only=True)['meta']['source_layout'] == 'openai_clip'

    outputs = golden['outputs']
    batch = GEN.reference_batch()
    model = VisionTransformer(family='clip', pretrained=out, out_indices=[0, 1],
                              out_type='raw', **golden['mmlinvit_kwargs'])
    model.init_weights()
    model.eval()
    with torch.no_grad():
        first, last = model(batch)
    errors = dict(block_0=(first - outputs['block_0']).abs().max().item(),
                  tokens_ln_post=(last - outputs['tokens_ln_post']).abs().max().item())
    assert max(errors.values()) <= TOL, errors
    # The projection comes out too: the pooled class token times it is encode_image.
    pooled_model = VisionTransformer(family='clip', **golden['mmlinvit_kwargs']).eval()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)
        report = load_pretrained(pooled_model, torchscript_release, trust_checkpoint=True,
                                 keep_projection=True)
    with torch.no_grad():
        (pooled,) = pooled_model(batch)
    embedding_err = (pooled @ report.extras['proj'].float() - outputs['embedding']).abs().max()
    assert embedding_err.item() <= TOL


def test_linearizer_configs_say_how_to_get_the_teacher():
    """tools/train.py's preflight names the download and the conversion when it is missing."""
    from mmengine.config import Config

    from mmlinvit.engine.preflight import find_missing_inputs

    for rel in ('vit-linearizer_clip-b16_adventurer-b_16xb64-300e_in1k-224x224.py',
                'vit-linearizer_clip-b16_vit-b-elu_16xb64-300e_in1k-224x224.py'):
        cfg = Config.fromfile(osp.join(REPO, 'configs', 'linearizer', rel))
        cfg.model.teacher.pretrained = '/nonexistent/clip_vit_b16_openai.pt'
        problems = [p for p in find_missing_inputs(cfg) if 'model.teacher.pretrained' in p]
        assert len(problems) == 1, problems
        assert 'ViT-B-16.pt' in problems[0] and '--trust-checkpoint' in problems[0]
        assert 'convert_checkpoint.py' in problems[0]
