"""Analysis utilities (torch only): FLOP counting and attention / activation maps."""
from .attention_maps import (activation_similarity_maps, capture_attention_inputs,
                             query_attention_maps, upsample_map)
from .flops import (ANALYTIC_OPERATORS, FLOP_CONVENTION, AnalyticFlops, FlopCount, FlopCounter,
                    analytic_vit_flops, attention_flops, block_gemm_flops, count_flops,
                    default_function_formulas, linear_attention_function_flops, sdpa_flops)

__all__ = [
    'FLOP_CONVENTION', 'ANALYTIC_OPERATORS', 'FlopCount', 'FlopCounter', 'count_flops',
    'sdpa_flops', 'linear_attention_function_flops', 'default_function_formulas',
    'AnalyticFlops', 'analytic_vit_flops', 'attention_flops', 'block_gemm_flops',
    'capture_attention_inputs', 'query_attention_maps', 'activation_similarity_maps',
    'upsample_map'
]
