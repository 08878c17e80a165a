"""Installs mmlinvit.  The pinned OpenMMLab stack is installed by ``tools/install.sh``.

Like the OpenMMLab packages, mmlinvit ships its configs inside the package as
``mmlinvit/.mim/configs`` plus ``mmlinvit/.mim/model-index.yml``, so that other repositories
can inherit them with ``_base_ = ['mmlinvit::adala/...']`` (see ``mmlinvit/config_scopes.py``):

* wheels / ``pip install .`` / ``pip install --target``: ``build_py`` copies ``configs/`` and
  ``model-index.yml`` into the built package;
* editable installs (``pip install -e .``): ``build_py`` runs in editable mode and creates
  symbolic links ``mmlinvit/.mim/configs -> ../../configs`` and
  ``mmlinvit/.mim/model-index.yml -> ../../model-index.yml`` in the source tree (ignored by
  git), so edits to the repository's configs are seen at once.  Where links cannot be
  created (Windows without privileges) the files are copied and a warning says so.
"""
import os
import os.path as osp
import shutil
import warnings

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

REPO = osp.dirname(osp.abspath(__file__))
#: Repository paths shipped as ``mmlinvit/.mim/<name>``.
MIM_FILES = ('configs', 'model-index.yml')


def _remove(path: str) -> None:
    if osp.islink(path) or osp.isfile(path):
        os.remove(path)
    elif osp.isdir(path):
        shutil.rmtree(path)


def _copy(src: str, dst: str) -> None:
    if osp.isdir(src):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    else:
        shutil.copyfile(src, dst)


class BuildPyWithMim(build_py):
    """``build_py`` that also places the configs in ``mmlinvit/.mim``."""

    def run(self) -> None:
        super().run()
        missing = [n for n in MIM_FILES if not osp.exists(osp.join(REPO, n))]
        if missing:
            raise FileNotFoundError(f'cannot ship {missing}: not found in {REPO}')
        if getattr(self, 'editable_mode', False):
            self._link_into_source_tree()
        else:
            target = osp.join(self.build_lib, 'mmlinvit', '.mim')
            os.makedirs(target, exist_ok=True)
            for name in MIM_FILES:
                _remove(osp.join(target, name))
                _copy(osp.join(REPO, name), osp.join(target, name))

    @staticmethod
    def _link_into_source_tree() -> None:
        mim = osp.join(REPO, 'mmlinvit', '.mim')
        os.makedirs(mim, exist_ok=True)
        for name in MIM_FILES:
            src, dst = osp.join(REPO, name), osp.join(mim, name)
            _remove(dst)
            try:
                os.symlink(osp.relpath(src, mim), dst)
            except OSError as err:
                warnings.warn(f'cannot link {dst} -> {src} ({err}); copied instead, so edits '
                              f'to {src} need a reinstall')
                _copy(src, dst)


setup(
    name='mmlinvit',
    version='0.1.0',
    description='Linearize pretrained softmax Vision Transformers inside OpenMMLab.',
    packages=find_packages(include=['mmlinvit', 'mmlinvit.*']),
    cmdclass={'build_py': BuildPyWithMim},
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
