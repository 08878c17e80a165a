"""The copy strategies of "Copy the Same, Distill the Difference": Random, Copy, MLPCopy, FullCopy.

Each selects a set of paired teacher tensors (see :mod:`.base` for the pairing rule); the rest
of the student keeps its own initialisation.  Per block, the canonical keys are ``norm1``,
``attn.qkv``, ``attn.proj``, ``ls1.gamma``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``, ``ls2.gamma``.

=============  =====================================================================
``random``     copies nothing.
``copy``       ``blocks.i.attn.qkv.{weight,bias}`` only (the paper's "Copy (QKV)").
``mlp_copy``   ``blocks.i.mlp.*`` and ``blocks.i.norm2.*`` (the MLP sub-blocks and their
               norms) and, when the teacher has LayerScale (DeiT-III / DINOv2),
               ``blocks.i.ls2.gamma``: the MLP branch is scaled by it, so a copied MLP
               under the student's own gamma (1e-5 at init) would contribute ~1e-5 of the
               teacher's branch.  Patch embedding, class token and position embedding stay
               random, as in the paper (whose DeiT / MAE teachers have no LayerScale).
               ``include_layer_scale=False`` leaves the gamma at its initialisation.
               A LayerScale on one side only (a DeiT-III teacher, a DeiT student) is
               refused (:func:`.base.check_transfer_structure`) unless
               ``include_layer_scale=False`` leaves it out on purpose.
``full_copy``  every tensor with a counterpart: patch embedding, class / register
               tokens, position embedding, ``pre_norm``, ``norm1``/``norm2``, QKV,
               output projection, LayerScale, MLP and the final ``norm``.  A teacher
               LayerScale / ``pre_norm`` / final ``norm`` / bias the student lacks (or a
               student one the teacher lacks) is refused, so a softmax student starts as
               the teacher.
=============  =====================================================================
"""
import re
from typing import Any, Dict

from .base import TRANSFER_STRATEGIES, TransferStrategy

_QKV = re.compile(r'^blocks\.\d+\.attn\.qkv\.(weight|bias)$')
_MLP = re.compile(r'^blocks\.\d+\.(mlp|norm2)\.')
_LS2 = re.compile(r'^blocks\.\d+\.ls2\.gamma$')


@TRANSFER_STRATEGIES.register_module('Random')
@TRANSFER_STRATEGIES.register_module('random')
class RandomInit(TransferStrategy):
    """Copies nothing: the student keeps its own initialisation."""

    name = 'random'


@TRANSFER_STRATEGIES.register_module('Copy')
@TRANSFER_STRATEGIES.register_module('copy')
class QKVCopy(TransferStrategy):
    """Copies the fused QKV projection (weight and bias) of every block."""

    name = 'copy'

    def selects(self, key: str) -> bool:
        return _QKV.match(key) is not None


@TRANSFER_STRATEGIES.register_module('MLPCopy')
@TRANSFER_STRATEGIES.register_module('mlp_copy')
class MLPCopy(TransferStrategy):
    """Copies the MLP (``mlp.*``) and its pre-norm (``norm2``) of every block.

    Args:
        include_layer_scale: Also copy ``ls2.gamma`` (the MLP branch's LayerScale) where the
            teacher has it; without it the copied MLP keeps the student's initial gamma and
            its branch is scaled down by that (1e-5 for DINOv2).  With ``True`` a LayerScale
            on one side only is refused (the copied branch would be 1/gamma or gamma times
            the teacher's); ``False`` leaves LayerScale out of the transfer on purpose.
    """

    name = 'mlp_copy'

    def __init__(self, include_layer_scale: bool = True) -> None:
        self.include_layer_scale = include_layer_scale

    def selects(self, key: str) -> bool:
        if _MLP.match(key) is not None:
            return True
        return self.include_layer_scale and _LS2.match(key) is not None

    def options(self) -> Dict[str, Any]:
        return dict(include_layer_scale=self.include_layer_scale)


@TRANSFER_STRATEGIES.register_module('FullCopy')
@TRANSFER_STRATEGIES.register_module('full_copy')
class FullCopy(TransferStrategy):
    """Copies every teacher tensor that has a student counterpart."""

    name = 'full_copy'

    def selects(self, key: str) -> bool:
        return True
