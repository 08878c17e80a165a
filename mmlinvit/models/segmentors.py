"""mmseg's EncoderDecoder with image metas that match every window it decodes."""
from typing import List

from mmseg.models.segmentors import EncoderDecoder as MMSegEncoderDecoder
from torch import Tensor

from mmlinvit.registry import MODELS


@MODELS.register_module()
class EncoderDecoder(MMSegEncoderDecoder):
    """mmseg's ``EncoderDecoder`` whose decoded windows carry their own ``pad_shape``.

    mmseg's ``Mask2FormerHead.predict`` upsamples its masks to ``pad_shape`` when the metas
    have one (the data preprocessor adds it when it pads test images, e.g. to a multiple of
    the patch size).  In sliding-window inference mmseg sets ``img_shape`` to each window but
    keeps ``pad_shape`` of the whole padded image, so every window's logits come back at the
    image size and cannot be pasted into the window.  Here ``pad_shape`` is the size of the
    tensor that is actually decoded: the padded batch in ``'whole'`` mode (unchanged) and
    the window in ``'slide'`` mode.  Everything else is mmseg's ``EncoderDecoder``; use it as
    ``type='mmlinvit.EncoderDecoder'`` with any mmseg head.
    """

    def encode_decode(self, inputs: Tensor, batch_img_metas: List[dict]) -> Tensor:
        """Decodes ``inputs`` (B, C, H, W) into logits at (H, W).

        Args:
            inputs: The (padded) images or one sliding window of them.
            batch_img_metas: Image metas; ``pad_shape`` is set to (H, W) for the decode.

        Returns:
            Segmentation logits (B, num_classes, H, W).
        """
        size = tuple(inputs.shape[-2:])
        metas = [dict(meta, pad_shape=size) for meta in batch_img_metas]
        return super().encode_decode(inputs, metas)
