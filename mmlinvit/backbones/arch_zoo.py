"""Architecture and family tables of the ViT skeleton shared by teacher and student."""
from typing import Dict

#: Sizes: width, depth, heads, MLP hidden width.
VIT_SIZES: Dict[str, dict] = {
    't': dict(embed_dims=192, num_layers=12, num_heads=3, mlp_hidden_dims=768),
    's': dict(embed_dims=384, num_layers=12, num_heads=6, mlp_hidden_dims=1536),
    'b': dict(embed_dims=768, num_layers=12, num_heads=12, mlp_hidden_dims=3072),
    'l': dict(embed_dims=1024, num_layers=24, num_heads=16, mlp_hidden_dims=4096),
    'h': dict(embed_dims=1280, num_layers=32, num_heads=16, mlp_hidden_dims=5120),
    # DINOv2 ViT-g/14: SwiGLU MLP with 4096-wide halves.
    'g': dict(embed_dims=1536, num_layers=40, num_heads=24, mlp_hidden_dims=4096),
}

#: Family conventions.  Every key is a constructor argument of ``VisionTransformer`` and can
#: be overridden individually.
VIT_FAMILIES: Dict[str, dict] = {
    'deit': dict(patch_size=16, img_size=224, layer_scale_init=None, act='gelu', norm_eps=1e-6,
                 pre_norm=False, patch_bias=True, pos_interp='bicubic'),
    'deit3': dict(patch_size=16, img_size=224, layer_scale_init=1e-6, act='gelu', norm_eps=1e-6,
                  pre_norm=False, patch_bias=True, pos_interp='bicubic'),
    'mae': dict(patch_size=16, img_size=224, layer_scale_init=None, act='gelu', norm_eps=1e-6,
                pre_norm=False, patch_bias=True, pos_interp='bicubic'),
    # pos_interp: the plain hub models; with registers see VIT_FAMILY_REGISTER_DEFAULTS.
    'dinov2': dict(patch_size=14, img_size=518, layer_scale_init=1e-5, act='gelu',
                   norm_eps=1e-6, pre_norm=False, patch_bias=True, pos_interp='dinov2',
                   with_mask_token=True),
    'clip': dict(patch_size=16, img_size=224, layer_scale_init=None, act='quick_gelu',
                 norm_eps=1e-5, pre_norm=True, patch_bias=False, pos_interp='bicubic'),
}

#: Sizes each family publishes (others can still be built, for tests and new recipes).
FAMILY_SIZES = {
    'deit': ('t', 's', 'b'),
    'deit3': ('s', 'b', 'l', 'h'),
    'mae': ('b', 'l', 'h'),
    'dinov2': ('s', 'b', 'l', 'g'),
    'clip': ('b', 'l'),
}

#: Family defaults that differ when the model has register tokens (``num_reg_tokens > 0``).
#: The DINOv2 hub builds ``dinov2_vit{s,b,l,g}14_reg`` with ``interpolate_antialias=True,
#: interpolate_offset=0.0`` and the plain ``dinov2_vit{s,b,l,g}14`` with ``False, 0.1``
#: (facebookresearch/dinov2, ``dinov2/hub/backbones.py``), so a DINOv2 model with registers
#: resamples its position grid with ``'dinov2_reg'``; an explicit ``pos_interp`` still wins.
VIT_FAMILY_REGISTER_DEFAULTS: Dict[str, dict] = {
    'dinov2': dict(pos_interp='dinov2_reg'),
}


def family_defaults(family: str, num_reg_tokens: int = 0) -> dict:
    """The constructor defaults of a family for a model with ``num_reg_tokens`` registers.

    Args:
        family: Name in :data:`VIT_FAMILIES`.
        num_reg_tokens: Number of register tokens of the model.

    Returns:
        A new dict: :data:`VIT_FAMILIES` ``[family]``, updated with
        :data:`VIT_FAMILY_REGISTER_DEFAULTS` ``[family]`` when the model has registers.

    Raises:
        KeyError: naming the unknown family and the available ones.
    """
    if family not in VIT_FAMILIES:
        raise KeyError(f'Unknown ViT family {family!r}; available: {sorted(VIT_FAMILIES)}')
    defaults = dict(VIT_FAMILIES[family])
    if num_reg_tokens > 0:
        defaults.update(VIT_FAMILY_REGISTER_DEFAULTS.get(family, {}))
    return defaults
