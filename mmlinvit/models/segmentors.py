"""mmseg's EncoderDecoder, aligned with patch-size padding and window metas."""
from typing import List, Optional, Tuple

import torch.nn.functional as F
from mmseg.models.segmentors import EncoderDecoder as MMSegEncoderDecoder
from mmseg.utils import SampleList
from torch import Tensor

from mmlinvit.registry import MODELS


#: Per-pixel label fields of a ``SegDataSample`` padded in training (with ``ignore_index``).
PIXEL_LABELS = ('gt_sem_seg', 'gt_edge_map', 'gt_depth_map')

#: Where the patch-size padding goes: ``'corner'`` at the bottom / right (mmseg's ``PatchEmbed``
#: ``padding='corner'``, timm's ``dynamic_img_pad``), ``'center'`` split between the sides,
#: the smaller half first (DINOv2's ``CenterPadding`` of its segmentation / depth evaluation).
PATCH_PADDINGS = ('corner', 'center')


@MODELS.register_module()
class EncoderDecoder(MMSegEncoderDecoder):
    """mmseg's ``EncoderDecoder`` whose logits stay aligned with the image pixels.

    Two differences from mmseg's class, everything else is inherited (use it as
    ``type='mmlinvit.EncoderDecoder'`` with any mmseg head):

    * **Patch-size padding.** A ViT / Adventurer backbone pads an input whose side is not a
      multiple of its ``patch_size`` at the bottom / right (mmseg's ``PatchEmbed`` with
      ``padding='corner'``), so its feature grid covers ``ceil(H / p) * p`` rows.  mmseg's
      heads then resize the logits of that larger area onto the H input rows, which shifts
      the prediction by up to p - 1 pixels at the bottom / right.  Here the input is padded
      the same way (zeros, i.e. the mean colour after normalisation) *before* the backbone,
      the logits are produced at the padded size and cropped back to (H, W), so every pixel's
      logit comes from the area of the image it belongs to.  In training the labels are
      padded with the decode head's ``ignore_index``.  Backbones without a ``patch_size``
      attribute (CNNs) are not padded.
      ``patch_padding='center'`` pads as DINOv2's ``CenterPadding`` does instead (the smaller
      half of each side's padding at the top / left), so that a DINOv2 backbone sees the
      image where its official segmentation evaluation puts it; the logits are cropped back
      from the same offsets.
    * **Window metas.** mmseg's ``Mask2FormerHead.predict`` upsamples its masks to
      ``pad_shape``; in sliding-window inference mmseg keeps ``pad_shape`` of the whole image,
      so each window's logits would come back at the image size.  Here ``img_shape`` and
      ``pad_shape`` are the size of the tensor actually decoded, in ``'whole'`` and
      ``'slide'`` mode.

    Args:
        *args: mmseg ``EncoderDecoder`` arguments.
        patch_padding: ``'corner'`` (default) or ``'center'`` (see :data:`PATCH_PADDINGS`).
        **kwargs: mmseg ``EncoderDecoder`` keyword arguments.
    """

    def __init__(self, *args, patch_padding: str = 'corner', **kwargs) -> None:
        if patch_padding not in PATCH_PADDINGS:
            raise ValueError(f'mmlinvit.EncoderDecoder: unknown patch_padding '
                             f"{patch_padding!r}; choose one of {list(PATCH_PADDINGS)} ('center' "
                             "is DINOv2's CenterPadding)")
        super().__init__(*args, **kwargs)
        self.patch_padding = patch_padding

    def patch_multiple(self) -> Optional[Tuple[int, int]]:
        """(p_h, p_w) the backbone needs inputs padded to, or ``None`` (no patch grid)."""
        patch = getattr(self.backbone, 'patch_size', None)
        if patch is None:
            return None
        if isinstance(patch, int):
            return (patch, patch)
        return (int(patch[0]), int(patch[1]))

    def patch_pads(self, hw: Tuple[int, int]) -> Tuple[int, int, int, int]:
        """(left, right, top, bottom) zero padding of an (H, W) input (``F.pad`` order)."""
        multiple = self.patch_multiple()
        if multiple is None:
            return (0, 0, 0, 0)
        pad_h, pad_w = -hw[0] % multiple[0], -hw[1] % multiple[1]
        top, left = (pad_h // 2, pad_w // 2) if self.patch_padding == 'center' else (0, 0)
        return (left, pad_w - left, top, pad_h - top)

    def encode_decode(self, inputs: Tensor, batch_img_metas: List[dict]) -> Tensor:
        """Decodes ``inputs`` (B, C, H, W) into logits at (H, W).

        Args:
            inputs: The (padded) images or one sliding window of them.
            batch_img_metas: Image metas; ``img_shape`` / ``pad_shape`` are set to the size
                of the decoded (patch-padded) tensor for the decode.

        Returns:
            Segmentation logits (B, num_classes, H, W).
        """
        h, w = inputs.shape[-2:]
        pads = self.patch_pads((h, w))
        if any(pads):
            inputs = F.pad(inputs, pads)
        size = tuple(inputs.shape[-2:])
        metas = [dict(meta, img_shape=size, pad_shape=size) for meta in batch_img_metas]
        logits = super().encode_decode(inputs, metas)
        left, _, top, _ = pads
        return logits[..., top:top + h, left:left + w]

    def loss(self, inputs: Tensor, data_samples: SampleList) -> dict:
        """mmseg's loss on inputs (and labels) padded to a multiple of the patch size
        (where ``patch_padding`` says).

        Args:
            inputs: Input images (B, C, H, W).
            data_samples: The seg data samples; their label maps (:data:`PIXEL_LABELS`) are
                padded in place with the decode head's ``ignore_index`` and their metas get
                the padded shape.

        Returns:
            The loss dict of mmseg's ``EncoderDecoder.loss``.
        """
        pads = self.patch_pads(tuple(inputs.shape[-2:]))
        if any(pads):
            inputs = F.pad(inputs, pads)
            size = tuple(inputs.shape[-2:])
            left, _, top, _ = pads
            ignore = self.decode_head.ignore_index
            for sample in data_samples:
                for key in PIXEL_LABELS:  # as mmseg's stack_batch pads them
                    if key not in sample:
                        continue
                    label = getattr(sample, key).data
                    delattr(getattr(sample, key), 'data')  # PixelData keeps its first shape
                    getattr(sample, key).data = F.pad(
                        label, (left, size[1] - left - label.shape[-1], top,
                                size[0] - top - label.shape[-2]), value=ignore)
                sample.set_metainfo(dict(batch_input_shape=size, pad_shape=size))
        return super().loss(inputs, data_samples)
