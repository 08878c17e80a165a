"""An ``attn_cfg`` dict whose type was changed by ``--cfg-options ...attn_cfg.type=elu`` keeps
the base's options (an MHLA config's ``block_grid``): a bare ``TypeError: unexpected keyword
argument 'block_grid'`` named neither the key nor the fix."""
import pytest

from mmlinvit.layers.attention import build_attention_operator


def test_options_of_another_operator_are_named_with_the_fix():
    with pytest.raises(TypeError, match=r"\['block_grid'\] are not options of the 'elu' "
                                        r"operator .*'eps'.*attn_cfg=elu"):
        build_attention_operator(dict(type='elu', block_grid=2), 32, 2)
    with pytest.raises(TypeError, match=r"'mmlinvit.ttt' operator"):
        build_attention_operator(dict(type='mmlinvit.ttt', block_grid=2), 32, 2)
    # own options (also those handed on to the base class) and builder defaults are fine
    build_attention_operator(dict(type='mhla', block_grid=2), 32, 2)
    build_attention_operator(dict(type='elu', backend='torch', qkv_bias=False), 32, 2)
    build_attention_operator('relu', 32, 2, qkv_bias=False)


def test_an_option_the_operator_fixes_itself_is_named():
    """'elu' is the kernel operator with feature_map='elu': giving feature_map too ended in
    Python's bare 'got multiple values' error."""
    with pytest.raises(TypeError, match=r"feature_map.*the operator fixes that option itself"):
        build_attention_operator(dict(type='elu', feature_map='relu'), 32, 2)
