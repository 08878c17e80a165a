"""Problem sizes of a GPU-suite run: the full GPU run and the tiny ``--dry-run``."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch


@dataclass
class Sizes:
    """Problem sizes of one suite run (full GPU run or ``--dry-run``).

    Args:
        la_check_tokens: Token counts of the linear attention correctness checks.
        la_heads: Heads of the linear attention checks and timings.
        la_head_dim: Head dimension (d = e) of the linear attention checks and timings.
        la_bench_tokens: Token counts of the linear attention timings (section 2).
        ssd_check_lengths: Sequence lengths of the SSD correctness checks.
        ssd_shape: ``heads``, ``headdim``, ``d_state``, ``groups``, ``chunk`` of the SSD scan.
        ssd_bench_lengths: Sequence lengths of the SSD timings (section 3).
        vit_l: ``arch`` of the ViT-L/14 models (a name or a dict).
        vit_l_sizes: Image sizes (H, W) of the ViT-L/14 pairs.
        vit_b: ``arch`` of the ViT-B/16 softmax model.
        adventurer_b: ``arch`` of Adventurer-B.
        adventurer_mixer: ``mixer_cfg`` of Adventurer-B (None: the default).
        pair_sizes: Image sizes of the ViT-B / Adventurer-B pairs.
        repeats: Timed calls (rounds) per measurement.
        extra_la_cases: More linear attention checks: (name, N, M, H, d, e, dtype, mode).
        sweep_tokens: (small, large) N of the launch sweeps.
        sweep_ssd_length: L of the SSD launch sweep.
        sweep_programs: ``target_programs`` values of the linear attention sweep.
        sweep_programs_out: ``target_programs_out`` values of the linear attention sweep.
        sweep_limit: Most variants per list (dry run: a few); None: all.
        vit_l_target: The image size of the speed / memory targets.
    """
    la_check_tokens: List[int]
    la_heads: int
    la_head_dim: int
    la_bench_tokens: List[int]
    ssd_check_lengths: List[int]
    ssd_shape: Dict[str, int]
    ssd_bench_lengths: List[int]
    vit_l: object
    vit_l_sizes: List[Tuple[int, int]]
    vit_b: object
    adventurer_b: object
    adventurer_mixer: Optional[dict]
    pair_sizes: List[Tuple[int, int]]
    repeats: int
    extra_la_cases: List[tuple] = field(default_factory=list)
    sweep_tokens: Tuple[int, int] = (16384, 65536)
    sweep_ssd_length: int = 16384
    sweep_programs: Tuple[int, ...] = (132, 264, 1056)
    sweep_programs_out: Tuple[int, ...] = (264, 528, 1056, 2112)
    sweep_limit: Optional[int] = None
    vit_l_target: Tuple[int, int] = (1024, 1024)


def full_sizes() -> Sizes:
    """The sizes of the GPU run (~2-3 min on an H200 without the sweeps)."""
    return Sizes(
        la_check_tokens=[1000, 4097, 16411], la_heads=16, la_head_dim=64,
        la_bench_tokens=[1024, 4096, 16384, 65536],
        ssd_check_lengths=[1024, 4133], ssd_shape=dict(heads=24, headdim=64, d_state=64,
                                                       groups=1, chunk=256),
        ssd_bench_lengths=[1024, 4096, 16384, 65536],
        vit_l='l', vit_l_sizes=[(518, 518), (1024, 1024), (2048, 2048)],
        vit_b='b', adventurer_b='b', adventurer_mixer=None,
        pair_sizes=[(512, 1024), (1024, 2048)], repeats=10,
        extra_la_cases=[  # (name, N, M, H, d, e, dtype, mode)
            ('relu d=e=128', 4097, 4097, 4, 128, 128, torch.bfloat16, 'relu'),
            ('relu d=e=128 fp32', 1000, 1000, 4, 128, 128, torch.float32, 'relu'),
            ('elu d=48 e=40 ragged', 4101, 4101, 4, 48, 40, torch.float16, 'elu'),
            ('inline', 4097, 4097, 16, 64, 64, torch.bfloat16, 'inline'),
            ('inline fp32 ragged', 1001, 1001, 16, 64, 64, torch.float32, 'inline'),
            ('inline trained acts', 16411, 16411, 16, 64, 64, torch.bfloat16, 'inline trained'),
            ('elu cross N!=M', 977, 3079, 16, 64, 64, torch.bfloat16, 'elu'),
        ])


def dry_sizes() -> Sizes:
    """The tiny sizes of ``--dry-run`` (CPU, Triton interpreter)."""
    tiny_vit = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_hidden_dims=64)
    return Sizes(
        la_check_tokens=[37, 70], la_heads=2, la_head_dim=16, la_bench_tokens=[64, 130],
        ssd_check_lengths=[40], ssd_shape=dict(heads=2, headdim=16, d_state=16, groups=1,
                                               chunk=16),
        ssd_bench_lengths=[48],
        vit_l=tiny_vit, vit_l_sizes=[(28, 28), (42, 42)],
        vit_b=tiny_vit, adventurer_b=dict(embed_dims=32, num_layers=2),
        adventurer_mixer=dict(d_state=16, headdim=16, chunk_size=16),
        pair_sizes=[(32, 48)], repeats=1,
        extra_la_cases=[('elu d=12 e=10 ragged', 29, 29, 2, 12, 10, torch.float16, 'elu'),
                        ('inline', 33, 33, 2, 16, 16, torch.bfloat16, 'inline'),
                        ('inline trained acts', 70, 70, 2, 16, 16, torch.float16,
                         'inline trained'),
                        ('elu cross N!=M', 17, 41, 2, 16, 16, torch.bfloat16, 'elu')],
        sweep_tokens=(40, 70), sweep_ssd_length=40, sweep_programs=(4, ),
        sweep_programs_out=(2, ), sweep_limit=2, vit_l_target=(42, 42))
