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
