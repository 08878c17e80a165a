"""Analysis utilities (torch only): FLOP counting, attention / activation maps, teacher-vs-student
comparisons on real photos and attention-output gaps, training curves, the compared model pairs.

The back ends of single tools are imported on their own: :mod:`.kernel_checks` (Triton kernels
vs PyTorch paths, ``gpu_suite``), :mod:`.layer_sensitivity` (which layers to linearize) and
:mod:`.distill_weight_sweep` (tables of the distillation-weight sweep) and :mod:`.sass_report`
(the Triton kernels' sm_90 machine code, compiled without a GPU), and the package
:mod:`.gpu_suite` (the sections, timing, SDPA backends, metadata and verdicts of
``tools/analysis/gpu_suite.py``).
"""
from .attention_gaps import (attention_gap, attention_output_stats, feature_gap,
                             relative_mse)
from .attention_maps import (activation_similarity_maps, capture_attention_inputs,
                             query_attention_maps, upsample_map)
from .compared_models import COMPARED_MODELS, SMOKE_MODEL, ComparedModel
from .curves import find_scalars, loss_keys, read_scalars, save_loss_curves
from .feature_pca import patch_features, pca_rgb, principal_components
from .figures import COMPARISON_COLUMNS, save_teacher_student_figure
from .flops import (ANALYTIC_OPERATORS, FLOP_CONVENTION, AnalyticFlops, FlopCount, FlopCounter,
                    analytic_vit_flops, attention_flops, block_gemm_flops, count_flops,
                    default_function_formulas, linear_attention_function_flops, sdpa_flops,
                    ssd_scan_function_flops)
from .photos import REAL_PHOTOS, center_crop_resize, load_photo
from .teacher_student import (TeacherStudentComparison, compare_teacher_student,
                              feature_cosine_gap)

__all__ = [
    'FLOP_CONVENTION', 'ANALYTIC_OPERATORS', 'FlopCount', 'FlopCounter', 'count_flops',
    'sdpa_flops', 'linear_attention_function_flops', 'ssd_scan_function_flops',
    'default_function_formulas',
    'AnalyticFlops', 'analytic_vit_flops', 'attention_flops', 'block_gemm_flops',
    'capture_attention_inputs', 'query_attention_maps', 'activation_similarity_maps',
    'upsample_map', 'patch_features', 'pca_rgb', 'principal_components', 'REAL_PHOTOS',
    'load_photo', 'center_crop_resize', 'TeacherStudentComparison', 'compare_teacher_student',
    'feature_cosine_gap', 'COMPARISON_COLUMNS', 'save_teacher_student_figure', 'read_scalars',
    'find_scalars', 'loss_keys', 'save_loss_curves', 'COMPARED_MODELS', 'SMOKE_MODEL', 'ComparedModel',
    'relative_mse', 'feature_gap', 'attention_gap', 'attention_output_stats'
]
