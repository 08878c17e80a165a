"""Unit checks of engine, layer, data and FLOP details that no other test pinned (a second
mutation audit: each of these changes passed the whole suite): every random stream restored on
resume, per-sample seeds independent of the number of processes, no weight decay on register
tokens, a crop smaller than the padding size on one side, MHLA's ``eps_placement='sum'``, a
label map of another height, cross-attention FLOPs over the keys, and the accumulation-window
checkpoint warning."""
import random
import numpy as np
import pytest
import torch


def test_n06_restore_puts_back_every_stream():
    from mmlinvit.engine.hooks.random_state_hook import capture_random_state, restore_random_state
    state = capture_random_state()
    ref = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_random_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == ref


def test_n11_sample_seeds_do_not_depend_on_the_world_size(monkeypatch):
    from mmengine.dataset import DefaultSampler
    import mmlinvit.engine.sample_seeding as ss
    data = list(range(12))
    seen={}
    for world_size in (1, 2, 3):
        for rank in range(world_size):
            monkeypatch.setattr(ss, 'get_dist_info', lambda r=rank, w=world_size: (r, w))
            import mmengine.dataset.sampler as ms
            monkeypatch.setattr(ms, 'get_dist_info', lambda r=rank, w=world_size: (r, w))
            sampler = ss.SampleSeedSampler(DefaultSampler(data, shuffle=False, seed=7), seed=7)
            for index, seed in sampler:
                # global position of index i with shuffle=False is i itself (12 % w == 0)
                assert seed == ss.sample_seed(7, 0, index), (world_size, rank, index)
                seen.setdefault(index, set()).add(seed)
    assert all(len(v) == 1 for v in seen.values())


def test_n15_register_tokens_get_no_weight_decay():
    from mmlinvit.backbones import VisionTransformer
    from mmlinvit.engine.optimizers.layer_decay_constructor import \
        LayerDecayOptimWrapperConstructor
    backbone = VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                           mlp_hidden_dims=64),
                                 img_size=32, patch_size=16, num_reg_tokens=2)
    model = torch.nn.Module(); model.backbone = backbone
    ctor = LayerDecayOptimWrapperConstructor(
        dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)),
        dict(layer_decay_rate=0.65))
    wrapper = ctor(model)
    groups = {n: g['weight_decay'] for g in wrapper.optimizer.param_groups for n in g['param_names']}
    assert groups['backbone.reg_token'] == 0.0
    assert groups['backbone.cls_token'] == 0.0 and groups['backbone.pos_embed'] == 0.0


def test_n25_label_map_of_another_height_is_a_problem(tmp_path):
    from PIL import Image
    from mmlinvit.datasets.integrity import check_sample
    img, seg = tmp_path / 'a.jpg', tmp_path / 'a.png'
    Image.new('RGB', (40, 30)).save(img)
    Image.new('L', (40, 20)).save(seg)  # same width, other height
    problems = check_sample(str(img), str(seg))
    assert len(problems) == 1 and '40x20' in problems[0][1], problems


def test_n16_a_crop_smaller_in_one_side_only_is_padded():
    from mmengine.config import Config
    from mmlinvit.engine.pad_size_check import find_pad_size_problem
    cfg = Config(dict(train_dataloader=dict(dataset=dict(data_root='ade', pipeline=[
        dict(type='RandomCrop', crop_size=(512, 256))])), model=dict(
            data_preprocessor=dict(type='SegDataPreProcessor', size=(512, 512)))))
    msg = find_pad_size_problem(cfg)
    assert msg is not None and 'pads every (512, 256) training crop' in msg, msg


def _mhla(**kw):
    from mmlinvit.layers.attention.mhla import MultiHeadLinearAttention
    torch.manual_seed(0)
    return MultiHeadLinearAttention(32, 2, block_grid=(2, 2), **kw).eval()


def test_n24_sum_placement_is_mean_placement_with_eps_over_n():
    x = torch.randn(2, 16, 32)
    n, eps = 16, 0.5  # a large eps so that its placement is visible
    a, b = _mhla(eps=eps, eps_placement='sum'), _mhla(eps=eps / n, eps_placement='mean')
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        ya, yb = a(x, hw_shape=(4, 4)), b(x, hw_shape=(4, 4))
        yc = _mhla(eps=eps, eps_placement='mean')
        yc.load_state_dict(a.state_dict()); yc = yc(x, hw_shape=(4, 4))
    torch.testing.assert_close(ya, yb)
    assert (ya - yc).abs().max() > 1e-4  # the placement matters at this eps


def test_n28_cross_attention_flops_count_the_keys():
    from torch.utils.flop_counter import FlopCounterMode
    from mmlinvit.analysis.flops import linear_attention_function_flops
    q, k, v = torch.rand(1, 2, 8, 4), torch.rand(1, 2, 32, 4), torch.rand(1, 2, 32, 6)
    with FlopCounterMode(display=False) as mode:  # the PyTorch path, written out
        s = k.transpose(-2, -1) @ v  # phi(K)^T V: 2 B H M d e
        q @ s  # phi(Q) S: 2 B H N d e
        q @ k.sum(-2, keepdim=True).transpose(-2, -1)  # normaliser: 2 B H N d
    assert linear_attention_function_flops(q, k, v, 0, False) == mode.get_total_flops()


@pytest.mark.parametrize('interval,warned', [(2, True), (6, True), (8, False), (12, False)])
def test_n31_checkpoint_interval_inside_windows_is_warned(monkeypatch, interval, warned):
    from mmengine.config import Config
    import mmlinvit.engine.accumulation as acc
    messages = []
    monkeypatch.setattr(acc, 'print_log', lambda msg, *a, **k: messages.append(msg))
    cfg = Config(dict(optim_wrapper=dict(type='OptimWrapper', accumulative_counts=4,
                                         optimizer=dict(type='SGD', lr=0.1)),
                      default_hooks=dict(checkpoint=dict(type='CheckpointHook', by_epoch=False,
                                                         interval=interval))))
    acc.adapt_to_accumulation(cfg)
    assert any('fall inside accumulation windows' in m for m in messages) == warned
