"""Diagnosing checkpoint files that cannot be read, before ``torch.load`` sees them.

``torch.load`` reports a damaged file with messages that name neither the file nor the cause
(``[Errno 22] Invalid argument`` for a truncated archive, a bare ``EOFError`` for an empty
file, an ``UnpicklingError`` for random bytes, which callers then mistake for a file that only
needs a full unpickle).  :func:`checkpoint_file_problem` looks at the file's structure instead:
``torch.save`` writes a zip archive whose end-of-archive record is written last, so a write
that was cut short (job killed, disk full) leaves an archive without it.  The check reads the
archive directory and the pickle record first, then (``verify_data=True``, the default) every
tensor record against the CRC-32 ``torch.save`` stored for it: ``torch.load`` itself never
checks those, so a checkpoint whose tensor bytes changed after it was written (a bad copy or
download, a disk error) loads without a word and gives silently wrong weights (measured: one
flipped byte, one changed value).  That pass reads the whole file once (about 1 GB/s on one
core, as fast as ``torch.load`` itself, which then reads it from the page cache);
``verify_data=False`` keeps to the directory and the pickle record (milliseconds).
"""
import os
import zipfile
import zlib
from typing import Optional, Union

#: First bytes of a zip archive (``torch.save`` since PyTorch 1.6).
ZIP_MAGIC = b'PK\x03\x04'
#: First bytes of the legacy (pre-1.6) ``torch.save`` format: pickle protocol 2 + the magic
#: number 0x1950a86a20f9469cfc6c as a 10-byte long.
LEGACY_TORCH_MAGIC = b'\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19'
#: The pickled magic number alone (LONG1, 10 bytes): legacy files of pickle protocol 2 / 3 have
#: it right after the 2-byte PROTO header, protocols 4 / 5 after a 9-byte FRAME opcode too.
LEGACY_MAGIC_LONG = LEGACY_TORCH_MAGIC[2:]


class CheckpointFileError(ValueError):
    """A checkpoint file is empty, truncated or not a checkpoint at all."""


def checkpoint_file_problem(path: Union[str, os.PathLike],
                            verify_data: bool = True) -> Optional[str]:
    """Describes why ``path`` cannot be a readable ``torch.save`` / safetensors file.

    Args:
        path: The file.
        verify_data: Also check every record of a ``torch.save`` zip archive against its
            CRC-32 (reads the whole file; see the module docstring).

    Returns:
        ``None`` when the file's structure is intact (a zip archive with its directory and a
        readable pickle record, a legacy torch file, or a safetensors file whose header fits),
        otherwise a sentence naming the cause, without the path.
    """
    path = os.fspath(path)  # a pathlib.Path too
    if not os.path.exists(path):
        return 'does not exist'
    if not os.path.isfile(path):
        return 'is not a file'
    size = os.path.getsize(path)
    if size == 0:
        return ('is empty (0 bytes): writing it was interrupted before any data was written '
                '(job killed or disk full)')
    with open(path, 'rb') as f:
        head = f.read(32)
    if is_safetensors_path(path):
        return _safetensors_problem(path, head, size)
    if head.startswith(ZIP_MAGIC):
        return _zip_problem(path, size, verify_data)
    if _is_legacy_torch(head):
        return None
    if _starts_safetensors(head, size):
        return (f'is a safetensors file without the .safetensors suffix, which chooses the '
                f'reader: rename it to {os.path.splitext(os.path.basename(path))[0]}'
                f'.safetensors')
    return (f'is not a PyTorch checkpoint: it is neither a zip archive (torch.save) nor a '
            f'legacy torch file (its {size} bytes start with {head[:8].hex(" ")}); the file '
            f'is damaged or is something else, so it was not unpickled')


def is_safetensors_path(path: str) -> bool:
    """Whether ``path`` is read as a safetensors file (its suffix, in any case)."""
    return path.lower().endswith('.safetensors')


def _starts_safetensors(head: bytes, size: int) -> bool:
    """Whether ``head`` starts a safetensors file: an 8-byte little-endian header length that
    fits the file, then the header's JSON object."""
    return (len(head) > 8 and head[8:9] == b'{'
            and 8 + int.from_bytes(head[:8], 'little') <= size)


def _is_legacy_torch(head: bytes) -> bool:
    """Whether ``head`` starts a legacy ``torch.save`` file of any pickle protocol (2 to 5)."""
    if head[:1] != b'\x80' or head[1:2] not in (b'\x02', b'\x03', b'\x04', b'\x05'):
        return False
    if head[2:3] == b'\x95':  # protocol 4+: FRAME and its 8-byte length come first
        return head[11:11 + len(LEGACY_MAGIC_LONG)] == LEGACY_MAGIC_LONG
    return head[2:2 + len(LEGACY_MAGIC_LONG)] == LEGACY_MAGIC_LONG


def _zip_problem(path: str, size: int, verify_data: bool) -> Optional[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.endswith('/data.pkl') or n == 'data.pkl']
            if not pickles:
                return (f'is a zip archive of {size} bytes without the data.pkl record of a '
                        f'torch.save file (records: {names[:5]})')
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    return (f'is truncated: record {info.filename!r} ends past the end of '
                            f'the {size}-byte file')
            try:
                archive.read(pickles[0])  # checks the record's CRC
            except zipfile.BadZipFile as err:  # whole, read: its bytes changed
                return (f'is damaged: its data.pkl record fails its check ({err}); the bytes '
                        f'changed after it was written (a bad copy or download, or a disk '
                        f'error): copy it again from its source')
            damaged = archive.testzip() if verify_data else None  # every record's CRC-32
            if damaged is not None:
                return (f'is damaged: its record {damaged!r} fails its CRC-32 check (torch.load '
                        f'does not check it and would load the changed tensor bytes as weights); '
                        f'the bytes changed after it was written (a bad copy or download, or a '
                        f'disk error): copy it again from its source')
    except zipfile.BadZipFile as err:
        return (f'is truncated or damaged: a torch.save zip archive of {size} bytes whose '
                f'directory cannot be read ({err}); writing it was probably cut short (job '
                f'killed or disk full)')
    except (OSError, EOFError, ValueError, RuntimeError, zlib.error) as err:
        # zlib / CRC / seek errors inside; a changed compression method or flag byte in the
        # directory: zlib.error, NotImplementedError (a RuntimeError), RuntimeError (encrypted)
        return f'is damaged: its zip archive ({size} bytes) cannot be read ({err})'
    return None


def _safetensors_problem(path: str, head: bytes, size: int) -> Optional[str]:
    if size < 8:
        return f'is truncated: a safetensors file of only {size} bytes (no header length)'
    header_len = int.from_bytes(head[:8], 'little')
    if 8 + header_len > size:
        return (f'is truncated or not a safetensors file: its header claims {header_len} '
                f'bytes but the file has {size}')
    if head[8:9] != b'{':  # the header is a JSON object (what _starts_safetensors tests)
        return (f'is not a safetensors file: its {header_len}-byte header is no JSON object '
                f'(it starts with {head[8:16]!r})')
    return None


def describe_read_error(path: str, err: BaseException) -> str:
    """One message for an exception raised while reading ``path``: file, cause, original error.

    Args:
        path: The checkpoint file.
        err: What the reader raised.

    Returns:
        The message.
    """
    problem = checkpoint_file_problem(path)
    cause = problem if problem else 'could not be read'
    return f'Checkpoint {path!r} {cause} ({type(err).__name__}: {err})'


def check_checkpoint_file(path: Union[str, os.PathLike]) -> None:
    """Raises :class:`CheckpointFileError` naming ``path`` and the cause when it is damaged.

    A missing file raises :class:`FileNotFoundError`.

    Args:
        path: The checkpoint file.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f'Checkpoint file {path!r} does not exist')
    problem = checkpoint_file_problem(path)
    if problem is not None:
        raise CheckpointFileError(f'Checkpoint {path!r} {problem}')
