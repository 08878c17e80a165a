# The "w/o distill" baseline of copy-mlp-distill-attn_deit-b-elu_64xb64-300e_in1k-224x224.py:
# same student, init and schedule, task loss only (the teacher is only used for the MLPCopy
# initialisation).
_base_ = './copy-mlp-distill-attn_deit-b-elu_64xb64-300e_in1k-224x224.py'
model = dict(distill_losses=None, student_recorders=None, teacher_recorders=None)
