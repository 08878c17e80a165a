# ViT-AdaLA, Stage 3 on ADE20K (Mask2Former, the linearized DINOv2-L student): the short name
# of configs/adala/mask2former_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py, which holds the
# recipe and explains how Stages 1-3 chain.
#   python tools/train.py configs/adala_dinov2_ade20k.py
# From another repository, inherit the full name (mmengine's `scope::` bases need a
# sub-directory):
#   _base_ = ['mmlinvit::adala/mask2former_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py']
_base_ = ['./adala/mask2former_adala-dinov2-l-elu_8xb2-160k_ade20k-518x518.py']
