"""mmlinvit: turn pretrained softmax ViTs into linear-complexity vision models."""
__version__ = '0.1.0'
