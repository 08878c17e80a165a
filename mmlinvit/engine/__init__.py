"""OpenMMLab engine parts of mmlinvit (imported lazily by ``mmlinvit.registry``)."""
from .hooks import (CheckFiniteHook, DistillLossScheduleHook, ExportStudentHook,  # noqa: F401
                    RandomStateHook)
from .optimizers import LayerDecayOptimWrapperConstructor  # noqa: F401
from .sample_seeding import SampleSeedDataset, build_sample_seed_sampler  # noqa: F401
