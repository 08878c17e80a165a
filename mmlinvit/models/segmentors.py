"""mmseg's EncoderDecoder, aligned with patch-size padding and window metas."""
from typing import List, Optional, Tuple

import torch.nn.functional as F
from mmseg.models.segmentors import EncoderDecoder as MMSegEncoderDecoder
from mmseg.utils import SampleList
from torch import Tensor

from mmlinvit.registry import MODELS


#: Per-pixel label fields of a ``SegDataSample`` padded in training (with ``ignore_index``).
PIXEL_LABELS = ('gt_sem_seg', 'gt_edge_map', 'gt_depth_map')


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
    * **Window metas.** mmseg's ``Mask2FormerHead.predict`` upsamples its masks to
      ``pad_shape``; in sliding-window inference mmseg keeps ``pad_shape`` of the whole image,
      so each window's logits would come back at the image size.  Here ``img_shape`` and
      ``pad_shape`` are the size of the tensor actually decoded, in ``'whole'`` and
      ``'slide'`` mode.
    """

    def patch_multiple(self) -> Optional[Tuple[int, int]]:
        """(p_h, p_w) the backbone needs inputs padded to, or ``None`` (no patch grid)."""
        patch = getattr(self.backbone, 'patch_size', None)
        if patch is None:
            return None
        if isinstance(patch, int):
            return (patch, patch)
        return (int(patch[0]), int(patch[1]))

    def _padding(self, hw: Tuple[int, int]) -> Tuple[int, int]:
        multiple = self.patch_multiple()
        if multiple is None:
            return (0, 0)
        return (-hw[0] % multiple[0], -hw[1] % multiple[1])

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
        pad_h, pad_w = self._padding((h, w))
        if pad_h or pad_w:
            inputs = F.pad(inputs, (0, pad_w, 0, pad_h))
        size = (h + pad_h, w + pad_w)
        metas = [dict(meta, img_shape=size, pad_shape=size) for meta in batch_img_metas]
        logits = super().encode_decode(inputs, metas)
        return logits[..., :h, :w]

    def loss(self, inputs: Tensor, data_samples: SampleList) -> dict:
        """mmseg's loss on inputs (and labels) padded to a multiple of the patch size.

        Args:
            inputs: Input images (B, C, H, W).
            data_samples: The seg data samples; their label maps (:data:`PIXEL_LABELS`) are
                padded in place with the decode head's ``ignore_index`` and their metas get
                the padded shape.

        Returns:
            The loss dict of mmseg's ``EncoderDecoder.loss``.
        """
        h, w = inputs.shape[-2:]
        pad_h, pad_w = self._padding((h, w))
        if pad_h or pad_w:
            inputs = F.pad(inputs, (0, pad_w, 0, pad_h))
            size = (h + pad_h, w + pad_w)
            ignore = self.decode_head.ignore_index
            for sample in data_samples:
                for key in PIXEL_LABELS:  # as mmseg's stack_batch pads them
                    if key not in sample:
                        continue
                    label = getattr(sample, key).data
                    delattr(getattr(sample, key), 'data')  # PixelData keeps its first shape
                    getattr(sample, key).data = F.pad(
                        label, (0, size[1] - label.shape[-1], 0, size[0] - label.shape[-2]),
                        value=ignore)
                sample.set_metainfo(dict(batch_input_shape=size, pad_shape=size))
        return super().loss(inputs, data_samples)
