"""The back end of ``tools/analysis/gpu_suite.py`` (torch, triton, matplotlib; no OpenMMLab).

The tool keeps the command line and the order of the sections; the pieces live here, one
module per concept:

* :mod:`.run`: the run's state (device, result dict, ``suite.json``), one guarded case
  (:meth:`~.run.SuiteRun.run_case`) and the atomic JSON writes;
* :mod:`.sizes`: the problem sizes of a GPU run and of ``--dry-run``;
* :mod:`.metadata`: device, MIG, TF32, versions and the peak-bandwidth table;
* :mod:`.timing`: eager and CUDA-graph timing, peak activation memory;
* :mod:`.sdpa`: ``scaled_dot_product_attention`` backends and the kernels they run;
* :mod:`.op_sections`: ceilings, kernel correctness, linear attention and SSD op timing;
* :mod:`.backbone_sections`: whole backbones and their per-kernel profiles;
* :mod:`.sweeps`: launch-parameter sweeps of the Triton kernels;
* :mod:`.verdicts`: ratios against the softmax baselines and the target lines;
* :mod:`.report`: the printed tables and ``suite.png``.

No module here imports triton itself at import time (the kernels are imported inside the
sections), but the parent package does through ``torch.utils.flop_counter``
(:mod:`mmlinvit.analysis.flops`): the tool sets ``TRITON_INTERPRET=1`` for ``--dry-run``
before importing anything from here.
"""
