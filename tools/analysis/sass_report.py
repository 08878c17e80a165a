"""SASS of the Triton kernels for a CUDA GPU, built here without one (registers, spills, loads).

Compiles every linear-attention and SSD kernel that one forward + backward launches, through
Triton's own JIT specialisation, for ``sm_<arch>``, and prints per kernel the registers, the
stack bytes (spills) and the count of each memory / matrix instruction by access width
(``LDG.128`` = 16-byte global loads, ``LDG.U16`` = one bf16 element per instruction).  No GPU
or CUDA driver is needed: triton's wheel carries ptxas and cuobjdump.  Back end:
:mod:`mmlinvit.analysis.sass_report`.

Usage::

    python tools/analysis/sass_report.py                       # bf16, sm_90, 1000 tokens
    python tools/analysis/sass_report.py --dtype bf16 fp32 --json /tmp/sass.json
"""
import argparse
import json
import os
import sys
from typing import List, Optional

if os.environ.get('TRITON_INTERPRET') == '1':
    raise SystemExit('sass_report compiles the kernels: unset TRITON_INTERPRET')

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mmlinvit.analysis.sass_report import kernel_reports  # noqa: E402
from mmlinvit.utils.benchmarking import print_table  # noqa: E402

DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32}


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--dtype', nargs='+', default=['bf16'], choices=sorted(DTYPES))
    parser.add_argument('--arch', type=int, default=90, help='compute capability, e.g. 90')
    parser.add_argument('--tokens', type=int, default=1000)
    parser.add_argument('--json', default=None, help='also write the reports to this file')
    args = parser.parse_args(argv)
    reports = {}
    for name in args.dtype:
        reports[name] = kernel_reports(DTYPES[name], args.tokens, args.arch)
        for ops, rows in reports[name].items():
            print(f'{ops}, {name}, sm_{args.arch}:')
            print_table(['kernel', 'regs', 'stack', 'instructions'],
                        [dict(kernel=r['kernel'], regs=str(r['regs']), stack=str(r['stack']),
                              instructions=' '.join(f'{k}:{v}' for k, v in r['counts'].items()))
                         for r in rows], indent='  ', rule=False)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(reports, f, indent=2)
    return reports


if __name__ == '__main__':
    main()
