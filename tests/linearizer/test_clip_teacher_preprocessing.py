"""The ViT-Linearizer's CLIP teacher sees what OpenAI CLIP's own preprocessing gives.

The real Adventurer Linearizer config (shrunk) is built by an mmengine Runner, which hands
the model the config's ImageNet data preprocessor; images go through the config's loading
pipeline.  The teacher's input, captured by a forward pre-hook, is compared with CLIP's
preprocessing of the same PNG files, written here from CLIP's published ``_transform``
(``Resize(n_px, bicubic)``, ``CenterCrop(n_px)``, RGB, ``ToTensor``, ``Normalize(CLIP mean,
CLIP std)``) with torchvision.  The images already have the model's size, so resize and crop
are the identity there and the comparison is on the normalisation.
"""
import torch
from mmengine.runner import Runner
from PIL import Image
from torchvision import transforms

from linearizer_testing import (IMG_SIZE, save_tiny_clip_teacher, tiny_distill_config,
                                write_images)

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def clip_preprocess(n_px: int) -> transforms.Compose:
    """OpenAI CLIP's image preprocessing (clip/clip.py ``_transform``)."""
    return transforms.Compose([
        transforms.Resize(n_px, interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.CenterCrop(n_px),
        lambda image: image.convert('RGB'),
        transforms.ToTensor(),
        transforms.Normalize(CLIP_MEAN, CLIP_STD),
    ])


def test_clip_teacher_input_equals_clip_preprocessing(tmp_path):
    data = write_images(str(tmp_path / 'data'), num=2)
    teacher = save_tiny_clip_teacher(str(tmp_path / 'clip_tiny.pth'))
    cfg = tiny_distill_config(data, str(tmp_path / 'work'), teacher, iters=1)
    runner = Runner.from_cfg(cfg)
    model = runner.model
    batch = next(iter(Runner.build_dataloader(cfg.train_dataloader)))
    data_batch = model.data_preprocessor(batch, training=True)
    seen = []
    model.teacher.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    with torch.no_grad():
        model.loss(data_batch['inputs'], data_batch['data_samples'])
    teacher_input = seen[0]

    paths = [sample.img_path for sample in data_batch['data_samples']]
    images = [Image.open(path) for path in paths]
    assert all(image.size == (IMG_SIZE, IMG_SIZE) for image in images)
    clip = torch.stack([clip_preprocess(IMG_SIZE)(image) for image in images])
    err = (teacher_input - clip).abs().max().item()
    print(f'\nteacher input vs CLIP preprocessing: max abs {err:.2e} '
          f'(range {clip.min().item():.2f}..{clip.max().item():.2f})')
    assert err < 1e-5
    # the student keeps the data preprocessor's ImageNet normalisation of the same pixels
    imagenet = torch.stack([transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)(
        transforms.ToTensor()(image.convert('RGB'))) for image in images])
    assert (data_batch['inputs'] - imagenet).abs().max().item() < 1e-5
    assert (teacher_input - data_batch['inputs']).abs().max().item() > 0.1
