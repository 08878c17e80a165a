"""mmlinvit.analysis.distill_weight_sweep: settings, run records and the regret table, against
numbers worked out here by hand (the sweep itself: tests/distill/test_normalized_loss.py)."""
import json

import pytest

from mmlinvit.analysis.distill_weight_sweep import (build_distill_loss, load_results,
                                                    setting_label, summarise, sweep_settings)
from mmlinvit.distill.losses import NormalizedAttentionOutputMSELoss


def _record(init, kind, weight, seed, score, task='digits'):
    return dict(task=task, init=init, kind=kind, weight=weight, seed=seed, iters=3,
                operator='relu', score=score)


def test_settings_labels_and_losses():
    settings = sweep_settings([50], [0.1, 1], baseline=True)
    assert settings == [('none', 0.0), ('raw', 50.0), ('normalized', 0.1), ('normalized', 1.0)]
    assert [setting_label(s) for s in settings] == ['w/o distill', 'raw 50', 'norm 0.1',
                                                    'norm 1']
    assert sweep_settings([], [1], baseline=False) == [('normalized', 1.0)]
    assert build_distill_loss(('none', 0.0)) is None
    loss = build_distill_loss(('normalized', 2.0))
    assert isinstance(loss, NormalizedAttentionOutputMSELoss) and loss.loss_weight == 2.0
    with pytest.raises(ValueError, match="use 'none', 'raw' or 'normalized'"):
        build_distill_loss(('scaled', 1.0))


def test_regret_is_the_mean_gap_to_the_best_setting_of_each_init():
    # random: none 50, raw 60 (seeds 58, 62), norm 70 -> best 70; regrets 20, 10, 0
    # copy:   none 80, raw 90, norm 85          -> best 90; regrets 10, 0, 5
    results = [_record('random', 'none', 0.0, 0, 50.0),
               _record('random', 'raw', 50.0, 0, 58.0), _record('random', 'raw', 50.0, 1, 62.0),
               _record('random', 'normalized', 1.0, 0, 70.0),
               _record('copy', 'none', 0.0, 0, 80.0), _record('copy', 'raw', 50.0, 0, 90.0),
               _record('copy', 'normalized', 1.0, 0, 85.0)]
    settings = sweep_settings([50], [1])
    tables = summarise(results, settings, ['random', 'copy'],
                       {'digits': dict(teacher_score=95.0, teacher_attn_mean_square=[0.5, 2.0])})
    lines = tables.splitlines()
    # Sample std (ddof=1) of 58, 62: sqrt((2^2 + 2^2) / (2 - 1)) = 2.83; one seed: the mean.
    assert '| Random | 50.0 | 60.0 +- 2.8 | **70.0** |' in lines
    assert '| Copy | 80.0 | **90.0** | 85.0 |' in lines
    assert 'mean +- sample std (ddof=1) over seeds [0, 1]' in tables
    assert 'softmax teacher: 95.00; teacher attention-output mean square per block: 0.5, 2' \
        in tables
    assert '| w/o distill | 15.00 | 15.00 |' in lines  # (20 + 10) / 2
    assert '| raw 50 | 5.00 | 5.00 |' in lines  # (10 + 0) / 2
    assert '| norm 1 | 2.50 | 2.50 |' in lines  # (0 + 5) / 2
    assert lines[-1] == 'setting with the smallest worst-task regret: **norm 1** (2.50 points)'


def test_load_results_keeps_the_last_record_of_a_run(tmp_path):
    path = tmp_path / 'results.jsonl'
    assert load_results(str(path)) == []
    records = [_record('copy', 'raw', 50, 0, 1.0), _record('copy', 'raw', 50.0, 0, 2.0),
               _record('copy', 'raw', 50.0, 1, 3.0)]
    path.write_text(''.join(json.dumps(r) + '\n' for r in records) + '\n')
    assert sorted(r['score'] for r in load_results(str(path))) == [2.0, 3.0]


def test_a_sweep_stopped_mid_line_resumes_after_whole_lines(tmp_path):
    """A sweep stopped while appending leaves a last line without its newline: resuming cut it
    off (its run is redone) instead of stopping on a bare JSONDecodeError or appending the
    next record onto it; a broken line elsewhere names the file and the line."""
    from mmlinvit.analysis.distill_weight_sweep import drop_partial_last_line
    path = tmp_path / 'results.jsonl'
    whole = json.dumps(_record('copy', 'raw', 50, 0, 1.0)) + '\n'
    partial = json.dumps(_record('copy', 'raw', 50, 1, 2.0))[:25]
    path.write_text(whole + partial)
    assert drop_partial_last_line(str(path)) == partial
    assert path.read_text() == whole
    assert drop_partial_last_line(str(path)) is None  # whole lines are kept
    assert drop_partial_last_line(str(tmp_path / 'none.jsonl')) is None
    assert [r['score'] for r in load_results(str(path))] == [1.0]
    path.write_text(partial + '\n' + whole)
    with pytest.raises(ValueError, match=r'results\.jsonl:1 is not JSON'):
        load_results(str(path))
