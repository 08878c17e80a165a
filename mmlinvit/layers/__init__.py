"""Neural-network layers (torch only): attention operators, blocks, embeddings."""
from .attention import ATTENTION_OPERATORS, AttentionOperator, build_attention_operator
from .patch_embed import PatchEmbed
from .pos_embed import resample_pos_grid, sincos_pos_embed_2d
from .transformer import DropPath, LayerScale, Mlp, SwiGLUMlp, TransformerBlock

__all__ = [
    'ATTENTION_OPERATORS', 'AttentionOperator', 'build_attention_operator', 'PatchEmbed',
    'resample_pos_grid', 'sincos_pos_embed_2d', 'DropPath', 'LayerScale', 'Mlp', 'SwiGLUMlp',
    'TransformerBlock'
]
