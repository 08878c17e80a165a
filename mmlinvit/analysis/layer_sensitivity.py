"""Which layers of a softmax ViT to linearize: per-layer alignment, costs and hybrids (torch only).

The back end of ``tools/analysis/layer_sensitivity.py``:

* :func:`align_layer`: a short ViT-AdaLA Stage 1 for one linearized layer (teacher forcing,
  attention-output MSE, only that layer's attention parameters train);
* :func:`layer_costs`: time and FLOPs of the teacher and of each block, softmax and linearized;
* :func:`propose` / :func:`choose`: one hybrid per budget k (keep the k most sensitive layers
  softmax) with its predicted time and FLOPs, and the pick within a time budget;
* :func:`sensitivity_table` / :func:`proposal_table` / :func:`pareto_table`: the Markdown
  tables of the report.

The gaps come from :mod:`mmlinvit.analysis.attention_gaps`.
"""
import time
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from mmlinvit.backbones import VisionTransformer
from mmlinvit.distill import ModuleInputsRecorder, ModuleOutputsRecorder
from mmlinvit.distill.losses import AttentionOutputMSELoss
from mmlinvit.transfer import transfer_weights
from .flops import FLOP_CONVENTION, count_flops


def hybrid_attn_cfg(num_layers: int, keep: Sequence[int], operator: str) -> List[str]:
    """Per-layer operators: softmax in ``keep``, ``operator`` elsewhere."""
    return ['softmax' if i in set(keep) else operator for i in range(num_layers)]


def clone_with_attn(backbone_cfg: dict, teacher: VisionTransformer,
                    attn_cfg: List[str]) -> VisionTransformer:
    """The teacher's architecture with per-layer ``attn_cfg`` and the teacher's weights
    (operator-only parameters keep their initialisation).

    Args:
        backbone_cfg: The teacher's ``VisionTransformer`` keyword arguments (a ``type`` key
            and ``pretrained`` are ignored).
        teacher: The loaded teacher.
        attn_cfg: One operator per layer.
    """
    kwargs = {k: v for k, v in backbone_cfg.items() if k != 'type'}
    kwargs.update(attn_cfg=attn_cfg, pretrained=None)
    model = VisionTransformer(**kwargs)
    model.init_weights()
    transfer_weights(model, teacher, strategy='full_copy')
    return model.eval()


def align_layer(student: VisionTransformer, teacher: VisionTransformer, index: int,
                images: torch.Tensor, iters: int, lr: float, batch_size: int,
                seed: int) -> List[float]:
    """Stage 1 for layer ``index``: teacher forcing, attention-output MSE, AdamW (cosine
    schedule) on that layer's attention parameters only.

    Args:
        student: The single-hybrid student (trained in place, left in eval mode).
        teacher: The softmax teacher (frozen).
        index: The linearized layer.
        images: (B, 3, H, W) normalised training images; batches are drawn with replacement.
        iters: AdamW steps.
        lr: Peak learning rate.
        batch_size: Images per step.
        seed: Seed of the batch sampling.

    Returns:
        The per-step losses.
    """
    params = list(student.blocks[index].attn.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, iters),
                                                          eta_min=lr * 0.01)
    loss_fn = AttentionOutputMSELoss(loss_weight=1.0)
    generator = torch.Generator().manual_seed(seed)
    block = student.blocks[index]
    block.train()
    losses = []
    with ModuleInputsRecorder(f'blocks.{index}').attach(teacher) as t_in, \
            ModuleOutputsRecorder(f'blocks.{index}.attn').attach(teacher) as t_out:
        for _ in range(iters):
            idx = torch.randint(0, len(images), (batch_size, ), generator=generator)
            with torch.no_grad():
                _, hw_shape = teacher.forward_tokens(images[idx])
                block_in, target = t_in.get(), t_out.get()
            out = block.forward_attn(block_in, hw_shape, teacher.num_prefix_tokens)
            loss = loss_fn(out, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
    student.eval()
    return losses


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up (the least disturbed by other
    processes on a shared machine)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.no_grad()
def layer_costs(backbone_cfg: dict, teacher: VisionTransformer, operator: str,
                resolution: Tuple[int, int], repeats: int) -> dict:
    """Time and FLOPs of the teacher backbone and of each block (softmax and linearized) on
    one ``resolution`` image.

    Args:
        backbone_cfg: The teacher's backbone config (see :func:`clone_with_attn`).
        teacher: The teacher.
        operator: The linear operator.
        resolution: (H, W) of the image.
        repeats: Timed calls (the fastest counts).

    Returns:
        ``dict(resolution, teacher_s, teacher_flops, blocks)``; ``blocks`` holds per block
        ``softmax_s``, ``linear_s``, ``softmax_flops`` and ``linear_flops`` (2 x MACs).
    """
    x = torch.randn(1, 3, *resolution)
    teacher.eval()
    total_s = best_seconds(lambda: teacher(x), repeats)
    total_flops = count_flops(teacher, x).total
    with ModuleInputsRecorder('blocks.{i}').attach(teacher) as rec:
        _, hw_shape = teacher.forward_tokens(x)
        block_inputs = rec.get()
    blocks = []
    for i, blk in enumerate(teacher.blocks):
        others = [j for j in range(teacher.num_layers) if j != i]
        linear = clone_with_attn(backbone_cfg, teacher,
                                 hybrid_attn_cfg(teacher.num_layers, others, operator)).blocks[i]
        tokens = block_inputs[i]
        prefix = teacher.num_prefix_tokens

        def run_softmax(blk=blk, tokens=tokens):
            return blk(tokens, hw_shape, prefix)

        def run_linear(linear=linear, tokens=tokens):
            return linear(tokens, hw_shape, prefix)

        blocks.append(dict(
            softmax_s=best_seconds(run_softmax, repeats),
            linear_s=best_seconds(run_linear, repeats),
            softmax_flops=count_flops(blk, tokens, hw_shape, prefix).total,
            linear_flops=count_flops(linear, tokens, hw_shape, prefix).total))
    return dict(resolution=list(resolution), teacher_s=total_s, teacher_flops=total_flops,
                blocks=blocks)


def propose(sensitivity: List[dict], costs: dict, operator: str) -> List[dict]:
    """Hybrid k = 0..L: keep the k layers of largest single-layer feature gap softmax.

    Args:
        sensitivity: Per layer a dict with its ``feature_gap``.
        costs: :func:`layer_costs`.
        operator: The linear operator.

    Returns:
        Per k: ``keep``, ``softmax_layers``, ``attn_cfg``, ``predicted_s`` and
        ``predicted_flops`` (the teacher's minus the linearized layers' savings) and
        ``predicted_gap_sum``.
    """
    num_layers = len(sensitivity)
    order = sorted(range(num_layers), key=lambda i: -sensitivity[i]['feature_gap'])
    proposals = []
    for k in range(num_layers + 1):
        keep = sorted(order[:k])
        linear = [i for i in range(num_layers) if i not in keep]
        saved_s = sum(costs['blocks'][i]['softmax_s'] - costs['blocks'][i]['linear_s']
                      for i in linear)
        saved_flops = sum(costs['blocks'][i]['softmax_flops'] -
                          costs['blocks'][i]['linear_flops'] for i in linear)
        proposals.append(dict(
            keep=k, softmax_layers=keep, attn_cfg=hybrid_attn_cfg(num_layers, keep, operator),
            predicted_s=costs['teacher_s'] - saved_s,
            predicted_flops=costs['teacher_flops'] - saved_flops,
            predicted_gap_sum=sum(sensitivity[i]['feature_gap'] for i in linear)))
    return proposals


def choose(proposals: List[dict], teacher_s: float, time_budget: Optional[float],
           keep: Optional[int]) -> dict:
    """The proposal with ``keep`` softmax layers, or the largest k within the time budget.

    Raises:
        ValueError: ``keep`` is out of range, or no proposal fits ``time_budget`` (a fraction
            of ``teacher_s``).
    """
    if keep is not None:
        if not 0 <= keep < len(proposals):
            raise ValueError(f'--keep {keep} is out of range: the model has '
                             f'{len(proposals) - 1} layers (k = 0..{len(proposals) - 1})')
        return proposals[keep]
    fitting = [p for p in proposals if p['predicted_s'] <= time_budget * teacher_s]
    if not fitting:
        raise ValueError(f'no hybrid fits --time-budget {time_budget}: even linearizing every '
                         f'layer is predicted at {proposals[0]["predicted_s"] / teacher_s:.2f} '
                         f'of the teacher time; raise the budget or use --keep')
    return max(fitting, key=lambda p: p['keep'])


def timing_warnings(costs: dict, proposals: List[dict], chosen: dict,
                    time_budget: Optional[float]) -> List[str]:
    """What makes the predicted times untrustworthy (timings of a busy or noisy machine).

    The teacher and each block are timed apart, so on a loaded machine the blocks' shares
    can add up to more than the whole and a prediction (teacher minus savings) can be
    negative; the choice made from such predictions can miss the budget.

    Args:
        costs: :func:`layer_costs`.
        proposals: :func:`propose`, with ``measured_s`` (each hybrid timed whole).
        chosen: The chosen proposal.
        time_budget: ``--time-budget`` (a fraction of the teacher time), or None.

    Returns:
        One sentence per problem found (empty when the timings agree).
    """
    teacher_s = costs['teacher_s']
    out = []
    share = sum(b['softmax_s'] for b in costs['blocks']) / teacher_s
    if share > 1.15:
        out.append(f'the blocks, timed one by one, take {100 * share:.0f}% of the teacher '
                   f'time (their sum cannot exceed the whole)')
    bad = [p['keep'] for p in proposals if p['predicted_s'] <= 0]
    if bad:
        out.append(f'predicted times <= 0 for keep k = {bad}')
    if time_budget is not None and chosen['measured_s'] > time_budget * teacher_s:
        out.append(f'the chosen hybrid (k = {chosen["keep"]}) measured '
                   f'{chosen["measured_s"] / teacher_s:.2f} of the teacher time, over the '
                   f'--time-budget {time_budget}')
    if out:
        out.append('the timings are noisy (a busy machine or too few --repeats): re-run with '
                   'more --repeats on a quiet machine, or choose with --keep from the '
                   'measured column')
    return out


def _resolution_text(resolution: Sequence[int]) -> str:
    return 'x'.join(str(r) for r in resolution)


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|---' * len(header) + '|']
    lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
    return '\n'.join(lines)


def sensitivity_table(sensitivity: List[dict], costs: dict) -> str:
    """Markdown, per layer: gaps, and time / FLOP shares of the teacher at the resolution."""
    res = _resolution_text(costs['resolution'])
    t_s, t_flops = costs['teacher_s'], costs['teacher_flops']
    rows = [[str(i),
             f'{s["attn_gap_before"]:.2e} -> {s["attn_gap"]:.2e}'
             f'{"" if s["alignment_kept"] else " (discarded)"}',
             f'{s["feature_gap"]:.2e}',
             f'{100 * c["softmax_s"] / t_s:.1f}% -> {100 * c["linear_s"] / t_s:.1f}%',
             f'{100 * c["softmax_flops"] / t_flops:.1f}% -> '
             f'{100 * c["linear_flops"] / t_flops:.1f}%']
            for i, (s, c) in enumerate(zip(sensitivity, costs['blocks']))]
    table = _markdown_table(['layer', 'attn-output gap (aligned)', 'feature gap',
                             f'time share at {res} (softmax -> linear)',
                             f'FLOP share at {res} (softmax -> linear)'], rows)
    return (f'{table}\n\nteacher backbone at {res}: {1000 * t_s:.1f} ms, '
            f'{t_flops / 1e9:.2f} GFLOPs ({FLOP_CONVENTION})')


def proposal_table(proposals: List[dict], costs: dict) -> str:
    """Markdown, per budget k: predicted / measured speed and the measured feature gap."""
    res = _resolution_text(costs['resolution'])
    rows = [[str(p['keep']), str(p['softmax_layers']), f'{1000 * p["predicted_s"]:.1f} ms',
             f'{1000 * p["measured_s"]:.1f} ms', f'{costs["teacher_s"] / p["measured_s"]:.2f}x',
             f'{p["predicted_flops"] / 1e9:.2f}', f'{p["feature_gap"]:.2e}'] for p in proposals]
    return _markdown_table(['keep k softmax', 'softmax layers', f'predicted time at {res}',
                            'measured time', 'speed-up (measured)', 'GFLOPs',
                            'feature gap (measured)'], rows)


def pareto_table(rows: List[dict], costs: dict) -> str:
    """Markdown, per trained hybrid: time, speed-up, FLOPs, feature gap and mIoU."""
    res = _resolution_text(costs['resolution'])
    cells = [[str(r['keep']), str(r['softmax_layers']), f'{1000 * r["measured_s"]:.1f} ms',
              f'{costs["teacher_s"] / r["measured_s"]:.2f}x', f'{r["predicted_flops"] / 1e9:.2f}',
              f'{r["feature_gap"]:.2e}', f'{r["mIoU"]:.2f}'] for r in rows]
    return _markdown_table(['keep k softmax', 'softmax layers', f'time at {res}', 'speed-up',
                            'GFLOPs', 'feature gap after Stage 1', 'mIoU after Stages 1-3'],
                           cells)
