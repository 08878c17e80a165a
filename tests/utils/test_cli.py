"""mmlinvit.utils.cli: the checkpoint tools share one parser shape and one --trust-checkpoint
wording; load_script imports a tool by path."""
import os.path as osp

import pytest

from mmlinvit.utils.cli import checkpoint_io_parser, load_script

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOLS = ('tools/linearize.py', 'tools/model_converters/convert_checkpoint.py',
         'tools/model_converters/export_student.py')


def test_checkpoint_io_parser_paths_and_trust_flag():
    parser = checkpoint_io_parser('d', ('src', 'in'), ('dst', 'out'), trust='a runner file')
    args = parser.parse_args(['a.pth', 'b.pth', '--trust-checkpoint'])
    assert (args.src, args.dst, args.trust_checkpoint) == ('a.pth', 'b.pth', True)
    assert 'allow a full unpickle of a runner file (runs code' in parser.format_help()
    plain = checkpoint_io_parser('d', ('teacher', 'in'), ('out', 'out'))
    assert vars(plain.parse_args(['a', 'b'])) == dict(teacher='a', out='b')
    with pytest.raises(SystemExit):
        plain.parse_args(['a', 'b', '--trust-checkpoint'])


@pytest.mark.parametrize('tool', TOOLS)
def test_checkpoint_tools_parse_trust_checkpoint(tool):
    module = load_script(osp.join(REPO, tool), 'cli_test_' + osp.basename(tool)[:-3])
    args = module.parse_args(['in.pth', 'out.pth', '--trust-checkpoint'])
    assert args.trust_checkpoint is True
    assert module.parse_args(['in.pth', 'out.pth']).trust_checkpoint is False


def test_load_script_names_a_file_that_is_not_python(tmp_path):
    path = tmp_path / 'notes.txt'
    path.write_text('x = 1\n')
    with pytest.raises(ImportError, match='cannot be imported as a Python module'):
        load_script(str(path), 'notes')
