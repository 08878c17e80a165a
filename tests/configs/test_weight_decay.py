"""Weight decay (and Mask2Former's embedding lr) of each config's model, via the optimizer.

Norms, biases and LayerScale (1-D), class / register / mask tokens and position embeddings
train without weight decay in every config (mmpretrain's ViT recipes, DeiT, the public
Adventurer code); the optimizer is built by the config's own constructor from the model
``test_all_configs`` builds (backbone widths divided, structure kept).
"""
import pytest
from mmengine.optim import build_optim_wrapper

from config_testing import MODEL_CONFIGS, build_shrunk_model

#: Name fragments of parameters that must not be decayed (besides 1-D parameters).
NO_DECAY = ('cls_token', 'reg_token', 'mask_token', 'pos_embed')


def _decay_of_trainable(model, optim_wrapper) -> dict:
    """Parameter name -> weight decay of its group, for every trainable parameter."""
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {}
    for group in optim_wrapper.optimizer.param_groups:
        for p in group['params']:
            if p.requires_grad:
                decay[names[id(p)]] = group['weight_decay']
    return decay


@pytest.mark.parametrize('rel', MODEL_CONFIGS)
def test_tokens_norms_and_biases_are_not_decayed(rel):
    cfg, model = build_shrunk_model(rel)
    decay = _decay_of_trainable(model, build_optim_wrapper(model, cfg.optim_wrapper))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(decay) == trainable, 'trainable parameters missing from the optimizer'
    wrong = sorted(n for n, p in model.named_parameters()
                   if n in decay and decay[n] != 0.0
                   and (p.ndim <= 1 or any(k in n.split('.')[-1] for k in NO_DECAY)))
    assert not wrong, f'{rel}: decayed tokens / norms / biases: {wrong}'
    # the rest (weight matrices) is decayed as configured
    base = cfg.optim_wrapper.optimizer.get('weight_decay', 0.0)
    matrices = [n for n in decay if n not in wrong and model.get_parameter(n).ndim >= 2
                and not any(k in n.split('.')[-1] for k in NO_DECAY)]
    assert all(decay[n] == pytest.approx(base) for n in matrices), rel


def test_mask2former_config_places_queries_as_vit_adapter():
    cfg, model = build_shrunk_model(
        'segmentation/mask2former_dinov2-l_8xb2-160k_ade20k-518x518.py')
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    lr_of = {n: g['lr'] for g in optimizer.param_groups for n in g['param_names']}
    base = cfg.optim_wrapper.optimizer.lr
    stem = base * 0.9**25  # ViT-L: 24 blocks + stem + head = 26 depths
    for name in ('decode_head.query_embed.weight', 'decode_head.query_feat.weight',
                 'decode_head.level_embed.weight', 'decode_head.cls_embed.weight',
                 'backbone.pos_embed'):
        assert lr_of[name] == pytest.approx(stem), name
    assert lr_of['decode_head.pixel_decoder.input_convs.0.conv.weight'] == pytest.approx(base)
