"""Token-record MSE, re-exported from :mod:`mmlinvit.distill.losses.token_mse`."""
from mmlinvit.distill.losses.token_mse import token_records_mse

__all__ = ['token_records_mse']
