"""ViT-Linearizer patch masking: a mask token replaces a fixed ratio of the student's patches.

Torch only.  :class:`PatchMasking` checks a student backbone once (it must provide
``forward_tokens(x, patch_mask, mask_token)``), makes the learnable mask token and draws the
masks.  Each image gets its own random set of ``N - int(N * (1 - ratio))`` masked patches of
the corner-padded ``(h, w)`` patch grid (``N = h * w``; MAE's ``random_masking`` count, which
keeps ``int(N * (1 - ratio))`` patches); the draw depends only on ``(seed, step, rank)``
(:func:`mask_stream_seed`), so a resumed run that restores ``step`` draws the same masks again.

``seed`` defaults to the run's seed: ``None`` reads torch's default generator's seed when the
component is built, which under mmengine is ``randomness.seed`` (the runner seeds before it
builds the model), so runs with other seeds draw other masks, as MAE's ``random_masking``
(``torch.rand`` from the seeded global generator) does.  On ``--resume`` ``tools/train.py``
builds the model under the interrupted run's seed (``meta['seed']`` of the checkpoint, when the
config sets none: :func:`mmlinvit.engine.resume.resume_randomness`), so with the restored
``mask_step`` the resumed run draws the interrupted run's masks.  An explicit ``seed=`` fixes
the masks whatever the run seed.

The mmengine integration, :class:`~mmlinvit.models.distill.DistillationModel`, keeps the mask
token and the step counter itself (checkpoint keys ``mask_token`` and ``mask_step``) and runs
this component (its ``patch_masking=dict(ratio=0.75)``).
"""
import inspect
from typing import Optional

import numpy as np
import torch
import torch.nn as nn

from mmlinvit.layers.patch_embed import patch_grid
from .errors import DistillationConfigError

#: Keys of the ``patch_masking`` config.
PATCH_MASKING_KEYS = ('ratio', 'seed', 'use_student_mask_token')

#: First spawn-key word of the mask streams: keeps them apart from the other seed domains
#: derived from the run seed (per-sample augmentation streams, per-rank process streams).
MASK_STREAM_TAG = 0x6D61736B  # 'mask'


def mask_stream_seed(seed: int, step: int, rank: int = 0) -> int:
    """The 64-bit seed of the masks of ``step`` on ``rank`` in a run whose mask seed is ``seed``.

    ``SeedSequence(seed, spawn_key=(MASK_STREAM_TAG, step, rank))``: every ``(seed, step,
    rank)`` gets its own stream (the former ``seed * 1_000_003 + step * 1_009 + rank`` gave
    step ``s`` of rank ``r + 1009`` the masks of step ``s + 1`` of rank ``r``).

    Args:
        seed: The mask seed (non-negative; taken modulo 2**64).
        step: Training step (>= 0).
        rank: Distributed rank (>= 0).
    """
    sequence = np.random.SeedSequence(int(seed) % 2**64,
                                      spawn_key=(MASK_STREAM_TAG, int(step), int(rank)))
    return int(sequence.generate_state(1, np.uint64)[0])


def sample_patch_mask(batch_size: int, num_patches: int, ratio: float, seed: int, step: int,
                      rank: int = 0) -> torch.Tensor:
    """Draws one random patch mask per image, on the CPU.

    Args:
        batch_size: Number of images B.
        num_patches: Patches per image N.
        ratio: Fraction of the patches masked: ``N - int(N * (1 - ratio))`` per image, as MAE's
            ``random_masking`` (it keeps ``int(N * (1 - ratio))``).
        seed: The mask seed (:attr:`PatchMasking.seed`).
        step: Training step (masks differ from step to step).
        rank: Distributed rank (masks differ from rank to rank).

    Returns:
        (B, N) bool, True where a patch is masked.

    Raises:
        DistillationConfigError: when the ratio is outside [0, 1) or leaves no patch visible.
    """
    ratio = float(ratio)
    if not 0.0 <= ratio < 1.0:  # NaN too; a negative count would slice from the end
        raise DistillationConfigError(f'patch_masking.ratio must be in [0, 1), got {ratio}')
    num_masked = num_patches - int(num_patches * (1 - ratio))
    if num_patches > 0 and num_masked >= num_patches:
        raise DistillationConfigError(
            f'patch_masking.ratio={ratio} masks all {num_patches} patches of the grid '
            f'(int(N * (1 - ratio)) = 0 visible): the activation-matching loss would see no '
            f'token; lower the ratio or use larger images')
    generator = torch.Generator().manual_seed(mask_stream_seed(seed, step, rank))
    noise = torch.rand(batch_size, num_patches, generator=generator)
    masked_idx = noise.argsort(dim=1)[:, :num_masked]
    mask = torch.zeros(batch_size, num_patches, dtype=torch.bool)
    mask.scatter_(1, masked_idx, True)
    return mask


class PatchMasking:
    """Masks a ratio of the student's patch tokens (ViT-Linearizer), checked at build time.

    Args:
        ratio: Fraction of the patch tokens replaced by the mask token, in [0, 1).
        seed: Seed of the mask draws; ``None`` (default) takes the run's seed, i.e. torch's
            default generator's seed when the component is built (under mmengine the run's
            ``randomness.seed``, as the structured inits'
            :meth:`~mmlinvit.transfer.base.AttentionInitStrategy.run_seed`); an integer fixes
            the masks for every run seed.
        use_student_mask_token: Use the student backbone's own ``mask_token`` parameter
            (e.g. Adventurer's, which then trains and is exported with the student) instead
            of a new one owned by the distillation model.

    Raises:
        DistillationConfigError: when ``ratio`` is outside [0, 1).
    """

    def __init__(self, ratio: float = 0.75, seed: Optional[int] = None,
                 use_student_mask_token: bool = False) -> None:
        ratio = float(ratio)
        if not 0.0 <= ratio < 1.0:
            raise DistillationConfigError(f'patch_masking.ratio must be in [0, 1), got {ratio}')
        if seed is not None and int(seed) < 0:
            raise DistillationConfigError(f'patch_masking.seed must be >= 0 or None, got {seed}')
        self.ratio = ratio
        #: Whether the seed follows the run (``seed=None``) or was fixed in the config.
        self.seed_from_run = seed is None
        #: The mask seed, resolved at build time.
        self.seed = torch.initial_seed() if seed is None else int(seed)
        self.use_student_mask_token = bool(use_student_mask_token)

    @classmethod
    def from_config(cls, cfg: dict) -> 'PatchMasking':
        """Builds the component from ``dict(ratio=..., seed=..., use_student_mask_token=...)``.

        Raises:
            DistillationConfigError: naming unknown keys.
        """
        cfg = dict(cfg)
        unknown = sorted(set(cfg) - set(PATCH_MASKING_KEYS))
        if unknown:
            raise DistillationConfigError(f"patch_masking takes 'ratio', 'seed' and "
                                          f"'use_student_mask_token', got unknown keys {unknown}")
        return cls(**cfg)

    def check(self, student: nn.Module, bare_backbone: bool = True,
              teacher_forcing: bool = False) -> None:
        """Checks that ``student`` can run with masked patches.

        Args:
            student: The student model.
            bare_backbone: Whether ``student`` is a bare backbone (not a task model).
            teacher_forcing: Whether teacher forcing drives the student (it cannot mask).

        Raises:
            DistillationConfigError: naming what the student lacks.
        """
        if not bare_backbone or teacher_forcing:
            raise DistillationConfigError('patch_masking needs a bare backbone student and no '
                                          'teacher forcing')
        params = inspect.signature(student.forward_tokens).parameters if callable(
            getattr(student, 'forward_tokens', None)) else {}
        if not {'patch_mask', 'mask_token'} <= set(params):
            raise DistillationConfigError(
                f'patch_masking needs the student backbone to provide forward_tokens(x, '
                f'patch_mask, mask_token); {type(student).__name__} does not')
        for attr in ('patch_size', 'embed_dims'):
            if not hasattr(student, attr):
                raise DistillationConfigError(f'patch_masking needs the student backbone '
                                              f'attribute {attr!r}')
        # forward_tokens(mask_token=None) falls back to the backbone's own token
        if self.use_student_mask_token and not isinstance(
                getattr(student, 'mask_token', None), nn.Parameter):
            raise DistillationConfigError(
                f'patch_masking.use_student_mask_token needs a mask_token parameter in the '
                f'student backbone; build {type(student).__name__} with '
                f'with_mask_token=True or drop use_student_mask_token')

    def make_mask_token(self, student: nn.Module) -> Optional[nn.Parameter]:
        """A new (1, C) mask token, truncated-normal (std 0.02); ``None`` with the student's own.

        Args:
            student: The checked student backbone (its ``embed_dims`` is C).
        """
        if self.use_student_mask_token:
            return None
        token = nn.Parameter(torch.zeros(1, student.embed_dims))
        nn.init.trunc_normal_(token, std=0.02)
        return token

    def sample(self, inputs: torch.Tensor, patch_size: int, step: int,
               rank: int = 0) -> torch.Tensor:
        """The masks of a batch (see :func:`sample_patch_mask`).

        Args:
            inputs: (B, C, H, W) batch; its (H, W) gives the corner-padded patch grid.
            patch_size: The student's patch side.
            step: Training step.
            rank: Distributed rank.

        Returns:
            (B, h * w) bool on the device of ``inputs``.
        """
        grid = patch_grid(inputs.shape[-2:], patch_size)  # corner-padded grid
        mask = sample_patch_mask(inputs.shape[0], grid[0] * grid[1], self.ratio, self.seed,
                                 step, rank)
        return mask.to(inputs.device)

    def forward_student(self, student: nn.Module, inputs: torch.Tensor, patch_mask: torch.Tensor,
                        mask_token: Optional[torch.Tensor]) -> None:
        """Runs the student on the masked batch (its recorders capture what the losses need).

        Args:
            student: The checked student backbone.
            inputs: (B, C, H, W) batch.
            patch_mask: (B, h * w) bool from :meth:`sample`.
            mask_token: The (1, C) mask token; ``None`` uses the student's own.
        """
        student.forward_tokens(inputs, patch_mask=patch_mask, mask_token=mask_token)

    def __repr__(self) -> str:
        seed = f'{self.seed} (run seed)' if self.seed_from_run else self.seed
        return (f'{type(self).__name__}(ratio={self.ratio}, seed={seed}, '
                f'use_student_mask_token={self.use_student_mask_token})')
