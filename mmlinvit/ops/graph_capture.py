"""Whether a graph is being captured (torch.compile / export, ONNX export, jit trace, CUDA
graph capture).

Eager paths that read tensor values on the host (a data-dependent branch, a chunk loop)
take their whole-tensor form while a graph is captured.
"""
import torch


def capturing_graph() -> bool:
    """Whether a graph is being captured (torch.compile / export, ONNX export, jit trace, or
    ``torch.cuda.graph`` capture on the current stream, where reading a device value on the
    host is an error)."""
    return (torch.compiler.is_compiling() or torch.compiler.is_exporting()
            or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()
            or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()))
