"""``load_from`` checks see the checkpoint as the model's load does: backbone tensors of
another shape are refused (mmengine skipped them with one warning: a checkpoint of another
MLP width trained those tensors from their random initialisation), and a file in another
layout (an mmpretrain classifier) counts as the converted weights it loads."""
import pytest
import torch

from mmlinvit.engine.checkpoint_coverage import (CheckpointCoverageError,
                                                 check_checkpoint_covers,
                                                 check_training_load_from)


def classifier(backbone: dict):
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    return MODELS.build(dict(type='ImageClassifier', backbone=backbone, neck=None,
                             head=dict(type='VisionTransformerClsHead', num_classes=5,
                                       in_channels=32)))


def mmlinvit_classifier(mlp: int = 64):
    return classifier(dict(type='mmlinvit.VisionTransformer', img_size=32, patch_size=8,
                           arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                     mlp_hidden_dims=mlp), out_type='cls_token'))


def test_backbone_tensors_of_another_shape_are_refused():
    model = mmlinvit_classifier(mlp=64)
    other = {'state_dict': mmlinvit_classifier(mlp=128).state_dict()}
    with pytest.raises(CheckpointCoverageError,
                       match=r"holds 6 weight\(s\) of the trainable backbone 'backbone' with "
                             r"another shape.*blocks.0.mlp.fc1.weight: checkpoint \(128, 32\)"):
        check_training_load_from(model, other, 'other.pth')
    check_training_load_from(model, {'state_dict': mmlinvit_classifier(64).state_dict()}, 'same')


def test_an_mmpretrain_classifier_file_covers_the_model():
    ref = classifier(dict(type='VisionTransformer', img_size=32, patch_size=8,
                          arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                    feedforward_channels=64), out_type='cls_token'))
    checkpoint = {'state_dict': ref.state_dict()}
    model = mmlinvit_classifier()
    check_training_load_from(model, checkpoint, 'mmpretrain.pth')
    check_checkpoint_covers(model, checkpoint, 'mmpretrain.pth')
    # a file of another model is still refused
    with pytest.raises(CheckpointCoverageError):
        check_checkpoint_covers(model, {'state_dict': {'backbone.x': torch.zeros(1)}}, 'x.pth')


def test_softmax_weights_are_not_evaluated_as_a_linear_model():
    """Softmax weights load into any operator (linearization starts there), but a softmax
    checkpoint evaluated by a linear config (tools/test.py, or attn_cfg changed by
    --cfg-options) computed another function, with no word."""
    def model(attn):
        return classifier(dict(type='mmlinvit.VisionTransformer', img_size=32, patch_size=8,
                               arch=dict(embed_dims=32, num_layers=2, num_heads=2,
                                         mlp_hidden_dims=64), out_type='cls_token',
                               attn_cfg=attn))
    softmax = {'state_dict': model('softmax').state_dict()}
    with pytest.raises(CheckpointCoverageError,
                       match=r"trained with attention operators \['softmax'\] but the model to "
                             r"evaluate \(backbone\) runs \['elu'\] in blocks \[0, 1\].*"
                             r"model.backbone.attn_cfg"):
        check_checkpoint_covers(model('elu'), softmax, 'softmax.pth')
    check_checkpoint_covers(model('softmax'), softmax, 'softmax.pth')
    check_checkpoint_covers(model('elu'), {'state_dict': model('elu').state_dict()}, 'elu.pth')
    check_training_load_from(model('elu'), softmax, 'softmax.pth')  # linearization start


def test_a_tensor_differing_in_a_later_dimension_is_reported():
    """mmengine's non-strict load skips it and leaves its initial values."""
    from mmlinvit.engine.checkpoint_coverage import mismatched_shapes
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    found = mismatched_shapes(model, {'0.weight': torch.zeros(3, 5), '0.bias': torch.zeros(3)})
    assert found == ['0.weight: checkpoint (3, 5) vs model (3, 4)'], found
    assert mismatched_shapes(model, model.state_dict()) == []
