"""Functional kernels and their plain PyTorch references (torch + optional triton only).

All token-mixing maths lives here; :mod:`mmlinvit.layers.attention` keeps the parameters and
calls these functions:

* :mod:`.feature_maps`: phi(x) of kernel linear attention (ELU + 1, ReLU, identity, Hedgehog).
* :mod:`.linear_attention`: non-causal linear / InLine attention (naive, torch, triton, dispatch).
* :mod:`.inline`: InLine's explicit O(N^2) map.
* :mod:`.identity_attention`: identity-map linear attention and its map.
* :mod:`.mhla`: MHLA's block summaries, block mixing, init and implied map.
* :mod:`.ttt`: ViT^3's one-step inner models.
* :mod:`.patch_grid`: token <-> grid layouts and depthwise convolutions of the local branches.
* :mod:`.signed_normaliser`: the sign-preserving normaliser.
* :mod:`.ssd`: the Mamba-2 SSD scan (naive, torch, triton, dispatch).
* :mod:`.causal_conv`: Mamba-2's causal depthwise convolution by shifted multiply-adds.
* :mod:`.triton_utils`: backend choice helpers and the kernels' head-dim / dtype limits.
"""
