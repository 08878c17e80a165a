# The "w/o distill" baseline of deit-b_elu_mlp-copy_distill-attn_in1k-224.py: same student,
# init and schedule, task loss only (the teacher is only used for the MLPCopy initialisation).
_base_ = './deit-b_elu_mlp-copy_distill-attn_in1k-224.py'
model = dict(distill_losses=None, student_recorders=None, teacher_recorders=None)
