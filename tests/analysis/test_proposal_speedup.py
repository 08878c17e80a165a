"""The 'speed-up (measured)' column of proposal_table is teacher time / hybrid time."""
from mmlinvit.analysis.layer_sensitivity import proposal_table


def test_speed_up_column_is_teacher_over_hybrid():
    costs = dict(resolution=(64, 64), teacher_s=0.020)
    proposals = [dict(keep=0, softmax_layers=[], predicted_s=0.008, measured_s=0.010,
                      predicted_flops=1e9, feature_gap=0.1)]
    row = proposal_table(proposals, costs).splitlines()[2]
    cells = [c.strip() for c in row.strip('|').split('|')]
    assert cells[4] == '2.00x'  # 20 ms / 10 ms: twice as fast as the teacher
