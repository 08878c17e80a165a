"""Installs mmlinvit.  The pinned OpenMMLab stack is installed by ``tools/install.sh``."""
from setuptools import find_packages, setup

setup(
    name='mmlinvit',
    version='0.1.0',
    description='Linearize pretrained softmax Vision Transformers inside OpenMMLab.',
    packages=find_packages(include=['mmlinvit', 'mmlinvit.*']),
    python_requires='>=3.10',
    install_requires=['torch>=2.6'],
    extras_require={
        'openmmlab': [
            'onedl-mmengine==0.10.12', 'onedl-mmcv==2.3.6',
            'onedl-mmsegmentation==1.4.2', 'onedl-mmpretrain==1.3.6',
            'onedl-mmdetection==3.5.1'
        ],
        'tests': ['pytest', 'timm==1.0.31', 'scikit-learn'],
    },
)
